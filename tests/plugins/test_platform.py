"""The plugin platform: built-ins come through entry points, the catalogue is generated, hooks are typed."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from spyglass.core.cli import plugins as cli_plugins
from spyglass.core.engine import hook_catalogue, hookspecs
from spyglass.core.engine.plugin_manager import (
    ENTRY_POINT_GROUP,
    create_plugin_manager,
    describe_plugins,
)

ROOT = Path(__file__).resolve().parents[2]
BUILT_INS = {
    "fcfs",
    "static",
    "priority",
    "fair",
    "slo",
    "prefix_cache",
    "metrics",
    "tracing",
    "request_log",
}
AUDIT = ROOT / "examples" / "plugins" / "spyglass-audit"


def test_built_ins_are_ordinary_entry_points():
    entry_points = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    assert entry_points.keys() >= BUILT_INS
    pm = create_plugin_manager()
    for name in BUILT_INS:
        plugin = pm.get_plugin(name)
        module, _, factory = entry_points[name].partition(":")
        if factory:  # a class entry point: this plugin manager's own instance
            assert type(plugin).__module__ == module and type(plugin).__qualname__ == factory
        else:
            assert plugin.__name__ == module


def test_enable_disable_and_unknown_names():
    names = {name for name, _ in describe_plugins(create_plugin_manager(["fcfs", "prefix_cache"]))}
    assert names == {"fcfs", "prefix_cache"}
    names = {
        name
        for name, _ in describe_plugins(create_plugin_manager(disabled=["prefix_cache", "tracing"]))
    }
    assert "fcfs" in names and not names & {"prefix_cache", "tracing"}
    with pytest.raises(ValueError, match="unknown plugin"):
        create_plugin_manager(["no_such_plugin"])


def test_spyglass_plugins_lists_plugins_and_hooks(capsys):
    args = type("Args", (), {"plugins": None, "disable_plugins": "tracing"})()
    assert cli_plugins.run(args) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert "tracing" not in lines
    assert lines["prefix_cache"].split(", ") == [
        "spyglass_blocks_full",
        "spyglass_engine_started",
        "spyglass_engine_stopped",
        "spyglass_match_prefix",
        "spyglass_request_scheduled",
    ]
    assert lines["priority"] == "spyglass_scheduling_policy"


def test_every_hookspec_has_a_docstring():
    assert hook_catalogue.undocumented_hooks() == []
    documented = {name for _, names in hook_catalogue.hooks_by_section() for name in names}
    assert documented == {name for name in dir(hookspecs) if name.startswith("spyglass_")}


def test_hook_catalogue_is_current():
    committed = (ROOT / "docs" / "hooks.md").read_text()
    assert committed == hook_catalogue.render(), (
        "run: python -m spyglass.core.engine.hook_catalogue > docs/hooks.md"
    )
    guide = (ROOT / "docs" / "plugins.md").read_text()
    assert "hooks.md" in guide and "hook_catalogue" in guide


# The recipe docs/plugins.md gives plugin authors, as it is: Spyglass's own files must pass it too.
MYPY_CONFIG = """\
[mypy]
[mypy-spyglass.*]
follow_imports = silent
[mypy-torch.*]
follow_imports = skip
"""

BAD_PLUGIN = """
from collections.abc import Iterable, Sequence

from spyglass.core.plugin_api import (
    EngineConfig, FinishReason, Request, SchedulingPolicy, StepStats, hookspecs, implements,
)


class HalfPolicy(SchedulingPolicy):  # subclassing the protocol makes mypy name what is missing
    name = "half"

    def admission_order(self, waiting: Sequence[Request], running: Sequence[Request]) -> Iterable[Request]:
        return waiting


@implements(hookspecs.spyglass_scheduling_policy)
def spyglass_scheduling_policy(name: str, config: EngineConfig) -> SchedulingPolicy | None:
    return HalfPolicy() if name == "half" else None


@implements(hookspecs.spyglass_request_finished)
def spyglass_request_finished(request: Request, reason: int) -> None:
    print(request.num_output_token)


@implements(hookspecs.spyglass_step_finished)
def spyglass_step_finished(step: StepStats) -> None:
    pass
"""


def run_mypy(tmp_path: Path, target: Path) -> subprocess.CompletedProcess:
    """mypy --strict on ``target``, seeing this checkout as the ``spyglass`` package (editable installs hide it)."""
    pytest.importorskip("mypy", reason="pip install mypy")
    (tmp_path / "stubs").mkdir(exist_ok=True)
    link = tmp_path / "stubs" / "spyglass"
    if not link.exists():
        link.symlink_to(ROOT, target_is_directory=True)
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(tmp_path / "mypy.ini"),
               "--cache-dir", str(tmp_path / "cache"), str(target)]  # fmt: skip
    env = {"MYPYPATH": str(tmp_path / "stubs"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def test_example_plugin_passes_mypy_strict_and_a_wrong_one_does_not(tmp_path):
    good = run_mypy(tmp_path, AUDIT / "spyglass_audit")
    assert good.returncode == 0, (
        good.stdout + good.stderr
    )  # no error from Spyglass's own files either
    bad_file = tmp_path / "bad_plugin.py"
    bad_file.write_text(BAD_PLUGIN)
    bad = run_mypy(tmp_path, bad_file)
    assert bad.returncode == 1
    assert 'expected "Callable[[Request, FinishReason], None]"' in bad.stdout
    assert '"Request" has no attribute "num_output_token"' in bad.stdout
    assert 'expected "def (stats: StepStats) -> None"' in bad.stdout
    assert (
        'Cannot instantiate abstract class "HalfPolicy" with abstract attributes "choose_victim" and '
        '"waiting_class"' in bad.stdout
    )
    assert "stubs/spyglass" not in bad.stdout  # every error is the plugin's


def test_plugin_api_names_exist():
    from spyglass.core import plugin_api

    for name in plugin_api.__all__:
        assert getattr(plugin_api, name) is not None
    with pytest.raises(TypeError, match="names must match"):
        plugin_api.implements(hookspecs.spyglass_request_finished)(lambda request, reason: None)


def test_factories_get_the_engine_context_and_modules_stay_modules():
    import types

    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.plugin_context import PluginContext
    from spyglass.core.engine.plugin_manager import instantiate
    from spyglass.telemetry.settings import TelemetrySettings

    telemetry = TelemetrySettings(metrics=False)
    context = PluginContext.for_config(EngineConfig(engine_id="e7", telemetry=telemetry))
    assert (context.engine_id, context.config.engine_id, context.telemetry) == (
        "e7",
        "e7",
        telemetry,
    )
    assert (
        PluginContext.for_config(EngineConfig()).engine_id
        != PluginContext.for_config(EngineConfig()).engine_id
    )

    class Plugin:
        def __init__(self, context):
            self.context = context

    module = types.ModuleType("module_plugin")
    assert instantiate(module, context) is module
    assert instantiate(Plugin, context).context is context
    assert instantiate(lambda context: None, context) is None  # a factory may decline an engine
    pm = create_plugin_manager(["metrics", "fcfs"], context=context)
    assert pm.context is context and pm.get_plugin("metrics").settings is telemetry
    assert pm.get_plugin("fcfs").__name__ == "spyglass.plugins.fcfs"


def test_the_guide_names_every_engine_option():
    import dataclasses

    from spyglass.core.engine.config import EngineConfig

    guide = (ROOT / "docs" / "plugins.md").read_text()
    missing = [
        field.name for field in dataclasses.fields(EngineConfig) if f"`{field.name}`" not in guide
    ]
    assert not missing, f"docs/plugins.md does not name the LLM(**engine_options) names {missing}"
