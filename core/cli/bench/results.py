"""What a benchmark run measured."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunResult:
    """One timed run of a workload."""

    seconds: float
    num_prompt_tokens: int
    num_output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        """Generated tokens per second."""
        return self.num_output_tokens / self.seconds

    @property
    def total_tokens_per_s(self) -> float:
        """Prompt plus generated tokens per second."""
        return (self.num_prompt_tokens + self.num_output_tokens) / self.seconds
