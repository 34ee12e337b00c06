"""`basic`: record only. Every interaction and report is kept; nothing is trained.

The default recipe of a deployment: it accepts any well-formed report (the gateway already checked the score is
finite and the references are known receipts of the scenario) and never produces a candidate.
"""

from dataclasses import dataclass, field

from reef_lab.errors import BadRequest
from reef_lab.schema import check_fields


@dataclass
class BasicConfig:
    require_score: bool = field(default=False, metadata={"help": "refuse reports without a score"})

    def __post_init__(self) -> None:
        check_fields(self)


class BasicRecipe:
    name = "basic"
    evolves = "nothing"

    def __init__(self, **config):
        self.config = BasicConfig(**config)

    def validate_report(self, report: dict) -> None:
        if self.config.require_score and report.get("score") is None:
            raise BadRequest("this scenario's recipe requires a 'score' in every report")

    def learner(self, ctx) -> None:
        return None

    @staticmethod
    def run_experiment(data: dict, progress: bool = True) -> dict:
        raise ValueError("the basic recipe records and learns nothing: an experiment needs a learning recipe "
                         "(sft, sao, grpo, gepa)")
