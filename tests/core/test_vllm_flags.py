"""vLLM's command-line options: taken where Spyglass has the setting, refused with the way here where not."""

import pytest

from spyglass.core.cli.engine_args import engine_config_from_args
from spyglass.core.cli.main import build_parser
from spyglass.core.cli.vllm_flags import REFUSED


def _serve(*argv: str):
    return build_parser(["serve", *argv]).parse_args(["serve", *argv])


def test_a_vllm_serve_line_carries_over():
    args = _serve(
        "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json",
        "--trust-remote-code", "--seed", "7", "--max-model-len", "4096", "--max-num-seqs", "8",
    )  # fmt: skip
    config = engine_config_from_args(args, seed=args.seed)
    assert (config.cuda_graphs, config.seed, config.max_model_len, config.max_num_seqs) == (
        False,
        7,
        4096,
        8,
    )
    assert "prefix_cache" not in config.disabled_plugins
    plain = _serve()
    assert engine_config_from_args(plain, seed=plain.seed).seed == 0


def test_prefix_caching_switches_its_plugin():
    off = engine_config_from_args(_serve("--no-enable-prefix-caching"))
    assert off.disabled_plugins == ["prefix_cache"]
    on = engine_config_from_args(_serve("--enable-prefix-caching", "--plugins", "fcfs"))
    assert on.plugins == ["fcfs", "prefix_cache"]
    with pytest.raises(SystemExit):
        engine_config_from_args(
            _serve("--enable-prefix-caching", "--disable-plugins", "prefix_cache")
        )


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_options_without_meaning_here_stop_the_command_with_what_to_use(flag, capsys):
    with pytest.raises(SystemExit) as stopped:
        _serve(flag, "1")
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert f"{flag} is vLLM's option, not taken here: {REFUSED[flag]}" in error
