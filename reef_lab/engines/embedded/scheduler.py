"""The embedded engine's scheduler: one background thread that runs the model and batches concurrent requests
continuously.

A request that arrives while a batch is decoding is prefilled (with the other newcomers, left-padded), its KV cache
rows are merged into the running batch's cache, and it decodes alongside the others from the next step on; finished
or cancelled rows leave the batch at the step where they end. Per-row position ids and an attention mask over the
padding keep every row's computation equal to running it alone (up to float rounding).

Each round: drop cancelled requests, admit newcomers (short prompts prefilled together at once, long ones queued for
chunked prefill), one decode step for every running batch, then one chunk of the oldest long prompt, sized by the
pacer (batching.py). Rows live in batches by (release, lane): a long prompt's row decodes in the "long" lane, so
short rows never carry its thousands of padding columns in their KV cache. Each batch decodes with its release's
model, so a generation's tokens all come from one set of weights.

The engine (engine.py) owns the releases and their routes; it shares with the scheduler the table of loaded models,
the set of retired releases (freed here once no row uses them) and the condition that guards both and the queue.
"""

from __future__ import annotations

import copy
import inspect
import logging
import threading
import time
from collections import deque
from concurrent.futures import CancelledError

import torch

from reef_lab.engines.base import Generation
from reef_lab.engines.embedded.batching import Batch, Prefill, PrefillPacer, Row
from reef_lab.engines.embedded.sampling import TextTracker, sample_token
from reef_lab.engines.embedded.stream import EmbeddedStream
from reef_lab.errors import EngineUnavailable

log = logging.getLogger("reef_lab.engines.embedded")

CLOSED = "the engine is closed (the server is stopping): retry in a few seconds"
MIN_CHUNK = 16  # fewest prompt tokens a prefill chunk takes (below this, a forward pass is mostly overhead)
_SHORT, _LONG = "short", "long"  # the lanes of running batches


class Scheduler:
    """Runs `models` (release id -> model, all of the base model's architecture) on one thread. `retired` names
    releases to free once no row uses them; `cv` guards both, and the queue of pending requests."""

    def __init__(self, model, tokenizer, models: dict[str, object], retired: set[str], cv: threading.Condition,
                 eos_ids: set[int], max_positions: int | None, device: torch.device, max_batch: int,
                 prefill_chunk: int, prefill_share: float, name: str):
        from transformers import DynamicCache

        self.max_batch, self.prefill_chunk = max_batch, prefill_chunk
        self.pacer = PrefillPacer(prefill_chunk, prefill_share, min_chunk=MIN_CHUNK)
        self._models, self._retired, self._cv = models, retired, cv
        self._config = model.config
        self._device, self._eos_ids, self._max_positions = device, eos_ids, max_positions
        self._pad_id = min(eos_ids) if eos_ids else 0
        # Callers encode one at a time (ChatTokenizer's lock); the scheduler decodes with its own copy.
        self._decode_tokenizer = copy.deepcopy(tokenizer)
        self._cache_class = DynamicCache
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._pending: deque[EmbeddedStream] = deque()
        self._live: set[EmbeddedStream] = set()  # submitted and maybe not done: close() answers them
        self._prefilling: deque[Prefill] = deque()  # long prompts, prefilled a chunk per round, oldest first
        self._batches: dict[tuple[str, str], Batch] = {}  # running batches by (release, lane)
        self.active = (0, 0)  # (decoding, prefilling) rows, published by the scheduler for info()
        self._step_lock = threading.Lock()  # held for each scheduler round
        self.closed = False
        self.stats = dict.fromkeys(["steps", "tokens_generated", "completed", "failed", "cancelled",
                                    "prefill_chunks", "prefill_chunk_tokens"], 0)
        self.thread = threading.Thread(target=self._run, name=f"reef-embedded-{name}", daemon=True)
        self._close_hooks = self._watch_close(model)
        self.thread.start()

    # -- called by the engine, from callers' threads --------------------------------------------------------------

    def add(self, stream: EmbeddedStream) -> None:
        """Queue a stream (the caller holds `cv` and has checked `closed`)."""
        with self._cv:
            self._pending.append(stream)
            if len(self._live) >= 4 * self.max_batch:  # forget the finished ones now and then
                self._live = {s for s in self._live if not s.done()}
            self._live.add(stream)
            self._cv.notify()

    def queue_depth(self) -> int:
        with self._cv:
            return len(self._pending)

    def close(self, timeout: float | None) -> None:
        """Stop the thread: requests queued, prefilling or decoding fail with EngineUnavailable (503, retry).

        The thread abandons the forward pass in progress at its next layer. If even that takes longer than
        `timeout`, the callers are answered now anyway. A second call returns at once."""
        with self._cv:
            if self.closed and not self.thread.is_alive():
                return
            first, self.closed = not self.closed, True
            live = list(self._live)
            self._cv.notify_all()
        if first:
            self.thread.join(timeout)
        for stream in live:
            stream._fail(EngineUnavailable(CLOSED))

    # -- the scheduler thread -----------------------------------------------------------------------------------

    def _watch_close(self, model) -> list:
        """Let close() end a forward pass between two layers: a long prompt's chunk on a busy CPU can take many
        seconds, and a stopping server should not wait for it (nor should the process exit while torch runs it).
        The hooks act on this scheduler's thread only; anyone else may run the same model."""
        def check(module, args):
            if self.closed and threading.current_thread() is self.thread:
                raise _Closing()
        return [layer.register_forward_pre_hook(check)
                for stack in model.modules() if isinstance(stack, torch.nn.ModuleList) for layer in stack]

    def _run(self) -> None:
        stopped: BaseException = EngineUnavailable(CLOSED)
        try:
            while (newcomers := self._next_newcomers()) is not None:
                with self._step_lock, torch.inference_mode():
                    self._round(newcomers)
                if self._retired:
                    self._free_retired()
        except _Closing:
            log.info("closed during a forward pass; it was abandoned")
        except BaseException as exc:  # a scheduler bug: callers get it instead of waiting forever
            log.exception("the embedded engine's scheduler stopped")
            stopped = exc
        finally:
            with self._cv:
                self.closed = True
                pending, self._pending = list(self._pending), deque()
            rows = [row for b in self._batches.values() for row in b.rows] + [job.row for job in self._prefilling]
            self._batches, self._prefilling, self.active = {}, deque(), (0, 0)
            for stream in pending + [row.stream for row in rows]:
                stream._fail(stopped)
            for hook in self._close_hooks:  # the model may live on (another engine, a trainer)
                hook.remove()

    def _round(self, newcomers: list[EmbeddedStream]) -> None:
        started = time.perf_counter()
        self._drop_cancelled()
        admitted = self._admit(newcomers) if newcomers else False
        busy = admitted or bool(self._batches)  # before the steps: rows that finish in them were work too
        for key in list(self._batches):
            self._step(key)
        now = time.perf_counter()
        self.pacer.round_done(now - started, busy, now)
        if self._prefilling:
            self._prefill_chunk(now)
        self.active = (sum(len(b.rows) for b in self._batches.values()), len(self._prefilling))

    def _is_long(self, prompt_tokens: int) -> bool:
        """Prompts longer than one chunk are prefilled in chunks and decode in the long lane."""
        return bool(self.prefill_chunk) and prompt_tokens > self.prefill_chunk

    def _next_newcomers(self) -> list[EmbeddedStream] | None:
        """Block until there is work; return the requests to admit now (None once closed). Short prompts admitted
        in one round are prefilled together, at most `prefill_chunk` tokens with padding; the rest wait a round."""
        with self._cv:
            while not self.closed and not self._pending and not self._batches and not self._prefilling:
                self._cv.wait()
            if self.closed:
                return None
            for stream in [s for s in self._pending if s.cancelled]:
                self._pending.remove(stream)
                self.stats["cancelled"] += 1
                stream._fail(CancelledError("cancelled by its caller before it started"))
            room = self.max_batch - sum(len(b.rows) for b in self._batches.values()) - len(self._prefilling)
            taken, shorts, width = [], 0, 0
            for stream in list(self._pending):
                if len(taken) >= room:
                    break
                tokens = len(stream.prompt_ids)
                if not self._is_long(tokens):
                    if shorts and self.prefill_chunk and (shorts + 1) * max(width, tokens) > self.prefill_chunk:
                        continue
                    shorts, width = shorts + 1, max(width, tokens)
                self._pending.remove(stream)
                taken.append(stream)
            return taken

    def _drop_cancelled(self) -> None:
        """Rows whose caller cancelled leave at the start of a round: within one decode step or prefill chunk."""
        for key, batch in list(self._batches.items()):
            gone = [i for i, row in enumerate(batch.rows) if row.stream.cancelled]
            if gone:
                for i in gone:
                    self._cancel(batch.rows[i], f"after {len(batch.rows[i].token_ids)} generated tokens")
                self._set_batch(key, self._keep(batch, [i for i in range(len(batch.rows)) if i not in gone]))
        for job in [job for job in self._prefilling if job.row.stream.cancelled]:
            self._prefilling.remove(job)
            self._cancel(job.row, f"during its prompt's prefill, {job.done} of {len(job.prompt_ids)} tokens done")

    def _cancel(self, row: Row, when: str) -> None:
        self.stats["cancelled"] += 1
        row.stream._fail(CancelledError(f"cancelled by its caller {when}"))

    def _free_retired(self) -> None:
        with self._cv:
            pinned = {s.release_id for s in self._pending} | {key[0] for key in self._batches} | \
                {job.row.release_id for job in self._prefilling}
            for release in [r for r in self._retired if r not in pinned]:
                self._retired.discard(release)
                del self._models[release]
                log.info("freed release %s", release)

    def _admit(self, streams: list[EmbeddedStream]) -> bool:
        """Queue the long prompts for chunked prefill; prefill the short ones of each release together, sample
        their first tokens and merge them into that release's short lane. True when any short one was admitted."""
        by_release: dict[str, list[EmbeddedStream]] = {}
        for stream in streams:
            if self._is_long(len(stream.prompt_ids)):
                self._prefilling.append(Prefill(self._new_row(stream), self._cache_class(config=self._config)))
            else:
                by_release.setdefault(stream.release_id, []).append(stream)
        for release, group in by_release.items():
            try:
                new = self._prefill(release, [self._new_row(stream) for stream in group])
            except Exception as exc:
                log.exception("prefill failed for %d request(s)", len(group))
                self._fail_rows_of(group, exc)
                continue
            if new is not None:
                self._join((release, _SHORT), new)
        return bool(by_release)

    def _join(self, key: tuple[str, str], new: Batch) -> None:
        batch = self._batches.get(key)
        if batch is None:
            self._batches[key] = new
            return
        try:
            batch.merge(new)
        except Exception as exc:
            log.exception("merging %d new row(s) into the batch failed", len(new.rows))
            self._fail_rows_of([row.stream for row in batch.rows + new.rows], exc)
            del self._batches[key]

    def _new_row(self, stream: EmbeddedStream) -> Row:
        params = stream.request.params
        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        max_tokens = params.max_tokens
        if self._max_positions:
            max_tokens = min(max_tokens, self._max_positions - len(stream.prompt_ids))
        text = TextTracker(self._decode_tokenizer, params.stop)
        return Row(stream, params, max_tokens, stream.release_id, generator, text)

    def _prefill(self, release: str, rows: list[Row]) -> Batch | None:
        lengths = [len(row.stream.prompt_ids) for row in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - lengths[i]:] = torch.tensor(row.stream.prompt_ids)
            mask[i, width - lengths[i]:] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self._cache_class(config=self._config)
        logits = self._forward(self._models[release], ids, mask, positions, cache)
        batch = Batch(rows, cache, mask, torch.tensor(lengths, device=self._device),
                      torch.zeros(len(rows), dtype=torch.long, device=self._device))
        return self._advance(batch, logits)

    def _prefill_chunk(self, now: float) -> None:
        """Prefill the next chunk of the oldest long prompt into its own KV cache; after its last chunk, sample its
        first token and move it to its release's long lane."""
        job = self._prefilling[0]
        shared = self.pacer.sharing(now)
        start = job.done
        end = start + min(self.pacer.size(now), job.left)
        ids = torch.tensor([job.prompt_ids[start:end]], device=self._device)
        mask = torch.ones((1, end), dtype=torch.long, device=self._device)
        positions = torch.arange(start, end, device=self._device)[None]
        began = time.perf_counter()
        try:
            logits = self._forward(self._models[job.row.release_id], ids, mask, positions, job.cache)
        except Exception as exc:
            log.exception("a prefill chunk failed (tokens %d-%d of %d)", start, end, len(job.prompt_ids))
            self._prefilling.popleft()
            self._fail_rows_of([job.row.stream], exc)
            return
        self.pacer.chunk_done(end - start, time.perf_counter() - began, shared)
        self.stats["prefill_chunks"] += 1
        self.stats["prefill_chunk_tokens"] += end - start
        job.done = end
        if job.left:
            return
        self._prefilling.popleft()
        batch = Batch([job.row], job.cache, mask, torch.tensor([end], device=self._device),
                      torch.zeros(1, dtype=torch.long, device=self._device))
        batch = self._advance(batch, logits)
        if batch is not None:
            self._join((job.row.release_id, _LONG), batch)

    def _set_batch(self, key: tuple[str, str], batch: Batch | None) -> None:
        if batch is None:
            self._batches.pop(key, None)
        else:
            self._batches[key] = batch

    def _step(self, key: tuple[str, str]) -> None:
        """One decode step for every row of one running batch."""
        batch = self._batches[key]
        try:
            mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
            logits = self._forward(self._models[key[0]], batch.next_tokens[:, None], mask, batch.positions[:, None],
                                   batch.cache)
            batch.mask, batch.positions = mask, batch.positions + 1
            self._set_batch(key, self._advance(batch, logits))
        except Exception as exc:
            log.exception("decode step failed; failing the %d row(s) of the batch", len(batch.rows))
            self._fail_rows_of([row.stream for row in batch.rows], exc)
            self._batches.pop(key, None)

    def _forward(self, model, ids, mask, positions, cache) -> torch.Tensor:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{self._cache_kwarg: cache})
        self.stats["steps"] += 1
        return out.logits[:, -1, :]

    def _advance(self, batch: Batch, logits: torch.Tensor) -> Batch | None:
        """Sample each row's next token; finished rows complete and leave. Returns the batch (None if empty)."""
        keep = []
        for i, row in enumerate(batch.rows):
            try:
                batch.next_tokens[i] = self._advance_row(row, logits[i])
            except Exception as exc:
                log.exception("sampling failed for one row")
                self._fail_rows_of([row.stream], exc)
                continue
            if row.finish_reason is None:
                keep.append(i)
            else:
                self._complete(row)
        return batch if len(keep) == len(batch.rows) else self._keep(batch, keep)

    def _advance_row(self, row: Row, logits: torch.Tensor) -> int:
        token, logprob = sample_token(logits, row.params, row.generator)
        self.stats["tokens_generated"] += 1
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if token in self._eos_ids:  # kept in token_ids and logprobs (training needs it), never in the text
            row.finish_reason = "stop"
            row.stream._push(row.text.finish())
            return token
        row.stream._push(row.text.add(token))
        if row.text.stop_at is not None:
            row.finish_reason = "stop"
            kept = row.text.tokens_before_stop()
            del row.token_ids[kept:], row.logprobs[kept:]
        elif len(row.token_ids) >= row.max_tokens:
            row.finish_reason = "length"
            row.stream._push(row.text.finish())
        return token

    def _complete(self, row: Row) -> None:
        self.stats["completed"] += 1
        row.stream._finish(Generation(
            text=row.text.returned_text,
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            prompt_token_ids=list(row.stream.prompt_ids),
            finish_reason=row.finish_reason,
            release_id=row.release_id,
            stop_sequence=row.text.stop_sequence,
        ))

    def _keep(self, batch: Batch, indices: list[int]) -> Batch | None:
        if not indices:
            return None
        batch.keep(indices)
        return batch

    def _fail_rows_of(self, streams: list[EmbeddedStream], exc: Exception) -> None:
        self.stats["failed"] += sum(stream._fail(exc) for stream in streams)


class _Closing(BaseException):
    """Raised between two layers of a forward pass once the engine is closed: not an Exception, so it passes
    the scheduler's per-batch error handling and ends the scheduler."""
