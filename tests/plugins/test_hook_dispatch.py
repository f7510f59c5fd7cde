"""Event hooks go through pluggy: its ordering and hook wrappers hold, and one failing plugin is contained."""

import pytest

from spyglass.core.engine.plugin_manager import create_plugin_manager
from spyglass.core.plugin_api import FinishReason, Request, hookimpl

from .conftest import add, drain


class Recorder:
    """Appends ``(label, request id)`` to a shared list when a request finishes."""

    def __init__(self, label: str, calls: list, fail: bool = False):
        self.label, self.calls, self.fail = label, calls, fail

    @hookimpl
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        self.calls.append((self.label, request.req_id))
        if self.fail:
            raise RuntimeError(f"{self.label} fails on purpose")


class First(Recorder):
    @hookimpl(tryfirst=True)
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        super().spyglass_request_finished(request, reason)


class Wrapper:
    """A new-style pluggy wrapper: runs around every other implementation of the hook."""

    def __init__(self, calls: list):
        self.calls = calls

    @hookimpl(wrapper=True)
    def spyglass_request_finished(self, request: Request, reason: FinishReason):
        self.calls.append(("wrapper-before", request.req_id))
        result = yield
        self.calls.append(("wrapper-after", request.req_id))
        return result


def test_event_hooks_follow_pluggy_order_and_wrappers(make_engine):
    calls: list = []
    # Registered in this order: pluggy calls the last registered first, tryfirst before all of them.
    plugins = [
        First("first", calls),
        Recorder("early", calls),
        Recorder("late", calls, fail=True),
        Wrapper(calls),
    ]
    engine = make_engine(extra=plugins)
    request = add(engine, [1, 2, 3])
    drain(engine)
    mine = [label for label, req_id in calls if req_id == request.req_id]
    assert mine == ["wrapper-before", "first", "late", "early", "wrapper-after"]
    # "late" raised: counted under its plugin name, and "early" and the wrapper still ran.
    late_errors = [
        key
        for key, count in engine.hooks.num_errors.items()
        if count and "spyglass_request_finished" in key
    ]
    assert len(late_errors) == 1 and engine.hooks.num_errors[late_errors[0]] == 1
    engine.shutdown()


def test_a_plugin_registered_after_the_engine_started_is_contained_too(make_engine):
    calls: list = []
    engine = make_engine()
    engine.plugin_manager.register(Recorder("late-comer", calls, fail=True), name="late_comer")
    engine.plugin_manager.register(Recorder("after-it", calls))
    request = add(engine, [4, 5, 6])
    assert drain(engine)[request.req_id].finished
    assert [label for label, _ in calls] == ["after-it", "late-comer"]
    assert engine.hooks.num_errors["late_comer.spyglass_request_finished"] == 1
    engine.shutdown()


def test_a_plugin_that_cannot_be_imported_is_named(tmp_path, monkeypatch):
    # A real installed distribution (a dist-info on sys.path) whose entry point names a missing module.
    dist = tmp_path / "spyglass_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spyglass-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[spyglass]\nbroken = spyglass_no_such_module:Plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        RuntimeError,
        match=r"plugin 'broken' \(spyglass_no_such_module:Plugin\) could not be loaded",
    ):
        create_plugin_manager(["fcfs", "broken"])
