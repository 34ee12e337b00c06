"""The install script: a POSIX sh program that writes one harness release into an agent's folder.

`GET /reef/harness/install?adapter=...` answers it; `sh install.sh [ROOT]` (or `curl ... | sh -s -- ROOT`) runs
it. Nothing the release holds is ever read by the shell as code: every file's bytes travel as base64 inside single
quotes (the base64 alphabet has no quote), and every name as a single-quoted word with its quotes escaped; names
are checked here (harness.check_path) and again by the script. The script:

- picks the install root: its argument, else `$REEF_HARNESS_ROOT`, else `$HOME/reef-harness/<scenario>`; refuses a
  relative root, one with `.` or `..` parts, one inside the current directory's tree (unless that is the home
  folder or above it) and one inside a git work tree (an install root lives outside any project);
- says "already current" and changes nothing when the folder holds this release with every file as written;
- refuses to write through a symbolic link: every path component from the root down is checked for every file
  before anything is written and again before each write, and files are written to a new temporary file (noclobber) and renamed into place;
- removes the files the previous release listed and this one does not, with the same checks;
- writes the release file last and checks every file's sha256 against it.
"""

from __future__ import annotations

import base64
import hashlib
import re
import textwrap

from reef_lab.agents.layout import FOLDER_ENV, KEY_ENV, RELEASE_FILE, Rendered
from reef_lab.harness import Harness

_HEAD = r"""#!/bin/sh
# shellcheck disable=SC2016 # file names are single-quoted on purpose: a '$(...)' in one is text, never run
# reef_lab harness install: scenario @SCENARIO@, release @RELEASE@, for @AGENT@.
# Rendered by GET /reef/harness/install. Usage: sh install.sh [ROOT]
# (default ROOT: $REEF_HARNESS_ROOT, else $HOME/reef-harness/<scenario>; the files go to ROOT/<agent>).
set -eu
umask 022
SCENARIO=@SCENARIO_Q@
RELEASE=@RELEASE_Q@
ADAPTER=@ADAPTER_Q@
NL='
'
die() { printf 'reef-harness: %s\n' "$*" >&2; exit 1; }

if command -v sha256sum >/dev/null 2>&1; then sha() { sha256sum < "$1" | cut -d ' ' -f 1; }
elif command -v shasum >/dev/null 2>&1; then sha() { shasum -a 256 < "$1" | cut -d ' ' -f 1; }
else die "neither sha256sum nor shasum is installed"; fi
if [ "$(printf 'eA==' | base64 -d 2>/dev/null)" = x ]; then b64d() { base64 -d; }
elif [ "$(printf 'eA==' | base64 -D 2>/dev/null)" = x ]; then b64d() { base64 -D; }
else die "base64 is not installed"; fi

root=${1:-${REEF_HARNESS_ROOT:-}}
if [ -z "$root" ]; then
  [ -n "${HOME:-}" ] || die "HOME is not set: give the install root as the first argument"
  root=$HOME/reef-harness/$SCENARIO
fi
case $root in /*) ;; *) die "the install root must be an absolute path, got: $root" ;; esac
case /$root/ in */../*|*/./*) die "the install root must not hold '.' or '..' parts: $root" ;; esac
while :; do case $root in */) root=${root%/} ;; *) break ;; esac; done
[ -n "$root" ] || die "the install root cannot be /"

# The root's physical path: its deepest existing folder, resolved, and the rest as given.
probe=$root rest=
while [ ! -d "$probe" ]; do rest=/${probe##*/}$rest; probe=${probe%/*}; [ -n "$probe" ] || probe=/; done
base=$(cd -P -- "$probe" && pwd -P)
real=${base%/}$rest
here=$(pwd -P)
home=
if [ -n "${HOME:-}" ] && [ -d "$HOME" ]; then home=$(cd -P -- "$HOME" && pwd -P); fi
case $real/ in
  "${here%/}"/*)
    case $home/ in "${here%/}"/*) ;; *) die "the install root $root is inside the current folder $here: run this from outside the project, or give a root elsewhere" ;; esac ;;
esac
up=$real
while [ -n "$up" ]; do
  if [ -e "$up/.git" ]; then die "the install root $root is inside the git work tree $up: install outside any project"; fi
  up=${up%/*}
done

dir=$root/$ADAPTER
checked() {  # a relative path from the server, checked again: no absolute path, no '.' or '..', no control chars
  case $1 in ''|/*|*//*|*/|*\\*) return 1 ;; esac
  case /$1/ in */../*|*/./*) return 1 ;; esac
  case $1 in *[[:cntrl:]]*) return 1 ;; esac
  return 0
}
no_links() {  # every existing component of $root/$1 from the root down: not a symbolic link
  p=$root
  [ ! -L "$p" ] || die "refusing to write through the symbolic link $p"
  r=$1
  while [ -n "$r" ]; do
    case $r in */*) part=${r%%/*}; r=${r#*/} ;; *) part=$r; r= ;; esac
    p=$p/$part
    [ ! -L "$p" ] || die "refusing to write through the symbolic link $p"
  done
}
put() {  # put PATH BASE64: write one file of the release
  checked "$1" || die "refusing the unsafe file name '$1'"
  no_links "$ADAPTER/$1"
  target=$dir/$1
  mkdir -p -- "${target%/*}"
  no_links "$ADAPTER/$1"
  [ ! -d "$target" ] || die "$target is a folder; the release has a file there"
  tmp=$target.reef-tmp.$$
  rm -f -- "$tmp"
  (set -C; printf '%s' "$2" | b64d > "$tmp") || die "could not write $tmp"
  mv -f -- "$tmp" "$target"
}
precheck() {  # every name and path of the release, before anything is written
  for path in "$@"; do
    checked "$path" || die "refusing the unsafe file name '$path'"
    no_links "$ADAPTER/$path"
  done
}
listed() {  # the paths a release file lists
  while IFS= read -r line; do
    case $line in 'file '*|'config '*) line=${line#* }; printf '%s\n' "${line#* }" ;; esac
  done < "$1"
}
verify() {  # every file a release file lists has the sha256 it lists
  while IFS= read -r line; do
    case $line in 'file '*|'config '*) ;; *) continue ;; esac
    line=${line#* }; want=${line%% *}; path=${line#* }
    checked "$path" || return 1
    [ -f "$dir/$path" ] && [ ! -L "$dir/$path" ] || return 1
    [ "$(sha "$dir/$path")" = "$want" ] || return 1
  done < "$1"
}
"""

_TAIL = r"""
no_links "$ADAPTER/$RELEASE_FILE"
new=$dir/$RELEASE_FILE.reef-new.$$
trap 'rm -f -- "$new"' EXIT
mkdir -p -- "$dir"
no_links "$ADAPTER/$RELEASE_FILE"
rm -f -- "$new"
(set -C; printf '%s' "$RELEASE_B64" | b64d > "$new") || die "could not write $new"
old=$dir/$RELEASE_FILE
if [ -f "$old" ] && cmp -s "$old" "$new" && verify "$old"; then
  rm -f -- "$new"
  printf 'already current: %s for %s in %s\n' "$RELEASE" "$ADAPTER" "$dir"
  exit 0
fi
keep=$NL$(listed "$new")$NL
if [ -f "$old" ]; then
  listed "$old" | while IFS= read -r path; do
    case $keep in *"$NL$path$NL"*) continue ;; esac
    checked "$path" || die "the old release file lists the unsafe name '$path'"
    no_links "$ADAPTER/$path"
    if [ -f "$dir/$path" ]; then
      rm -f -- "$dir/$path"
      printf 'removed %s (not in %s)\n' "$path" "$RELEASE"
      sub=${path%/*}
      while [ "$sub" != "$path" ] && rmdir -- "$dir/$sub" 2>/dev/null; do
        case $sub in */*) sub=${sub%/*} ;; *) break ;; esac
      done
    fi
  done
fi
"""

_END = r"""
mv -f -- "$new" "$dir/$RELEASE_FILE"
verify "$dir/$RELEASE_FILE" || die "a written file does not match its sha256 in $dir/$RELEASE_FILE"
printf 'installed %s for %s in %s\n' "$RELEASE" "$ADAPTER" "$dir"
@HINT@
"""


def quote(word: str) -> str:
    """`word` as one single-quoted sh word (a quote inside it closes, escapes and reopens)."""
    return "'" + word.replace("'", "'\\''") + "'"


def b64(text: str) -> str:
    return "\n".join(textwrap.wrap(base64.b64encode(text.encode()).decode(), 76)) or ""


def render_script(adapter: str, scenario: str, release_id: str, rendered: Rendered) -> str:
    head = (_HEAD.replace("@SCENARIO_Q@", quote(scenario)).replace("@RELEASE_Q@", quote(release_id))
            .replace("@ADAPTER_Q@", quote(adapter)).replace("@SCENARIO@", _comment(scenario))
            .replace("@RELEASE@", _comment(release_id)).replace("@AGENT@", adapter))
    every = sorted({**rendered.files, **rendered.config}.items())
    lines = [head, f"RELEASE_FILE={quote(RELEASE_FILE)}", f"RELEASE_B64={quote(b64(rendered.release_text))}",
             "precheck " + " ".join(quote(path) for path, _ in every), _TAIL]
    for path, text in every:
        lines.append(f"put {quote(path)} {quote(b64(text))}")
    hint = _hint(adapter)
    lines.append(_END.replace("@HINT@", hint))
    return seal("\n".join(lines))


# ---- what `reef-lab agent install` checks before it runs a script (reef_lab/agents/cli.py) -----------------------
END_MARK = "# reef_lab install script end; sha256 of all above: "
_WHO = re.compile(r"# reef_lab harness install: scenario (.*), release (.*), for ([a-z]+)\.")


def seal(text: str) -> str:
    """The script with its last line: END_MARK and the sha256 of everything before it (a script cut short, or one
    another program answered, is refused by the wrapper before `sh` sees a byte of it)."""
    body = text if text.endswith("\n") else text + "\n"
    return f"{body}{END_MARK}{hashlib.sha256(body.encode()).hexdigest()}\n"


def check_script(data: bytes, adapter: str, scenario: str, release: str | None) -> str:
    """The text of an install script the server answered, if it is one reef_lab rendered whole for this adapter,
    scenario (and release, when one was asked for); ValueError says what is wrong. The wrapper calls it before it
    runs the script (docs/harness.md says why this check and not a signature)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    fixed = _HEAD.split("\n", 2)[:2]
    lines = text.split("\n", 3)
    if lines[:2] != fixed:
        raise ValueError(f"it does not open with reef_lab's install script header (it opens with {text[:60]!r})")
    who = _WHO.fullmatch(lines[2]) if len(lines) > 2 else None
    named = release if not release or ":" in release else f"{scenario}:{release}"  # vN or <scenario>:vN
    if (who is None or who.group(1) != _comment(scenario) or who.group(3) != adapter
            or (named and who.group(2) != _comment(named))):
        got = lines[2][:160] if len(lines) > 2 else "nothing"
        raise ValueError(f"it installs something else: {got!r}, not scenario {scenario!r}"
                         f"{f', release {release}' if release else ''} for {adapter}")
    body, _, last = text[:-1].rpartition("\n") if text.endswith("\n") else ("", "", "")
    if not last.startswith(END_MARK):
        raise ValueError("it does not end with reef_lab's end line: it was cut short (or the server is older than "
                         "this reef-lab)")
    if hashlib.sha256((body + "\n").encode()).hexdigest() != last[len(END_MARK):]:
        raise ValueError("its sha256 does not match its end line: it was changed or cut on the way")
    return text


def _comment(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)  # names are printable already; a comment stays one


def _hint(adapter: str) -> str:
    if adapter == "files":
        return ""
    var = FOLDER_ENV[adapter]
    return (f"printf 'run it: reef-lab agent {adapter} (or {var}=%s {KEY_ENV}=<token or any> {adapter})\\n' "
            '"$dir"')


def install_script(harness: dict, tree: Harness, adapter: str | None, base_url: str, model: str) -> str:
    """The install script of `harness` ({scenario, release_id, ...}, as Gateway.harness_release gives it with its
    parsed `tree`: no front matter is parsed here)."""
    from reef_lab.agents.layout import ADAPTERS, Binding, render
    from reef_lab.errors import BadRequest

    if adapter not in ADAPTERS:
        raise BadRequest(f"query parameter 'adapter' must be one of {list(ADAPTERS)}, got {adapter!r}")
    binding = Binding(base_url.rstrip("/"), harness["scenario"], harness["release_id"], model)
    return render_script(adapter, harness["scenario"], harness["release_id"], render(adapter, tree, binding))
