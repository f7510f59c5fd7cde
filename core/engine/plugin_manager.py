"""Loading plugins from the ``spyglass`` entry-point group and calling their hooks safely."""

import importlib.metadata
import inspect
import logging
from collections.abc import Callable

import pluggy

from spyglass.core.engine import hookspecs
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.plugin_context import PluginContext

log = logging.getLogger("spyglass.plugins")

_GUARDED = (
    "_spyglass_guarded"  # marks an event hook implementation already wrapped by `SafeHookRelay`
)

ENTRY_POINT_GROUP = "spyglass"


class SafeHookRelay:
    """The plugin manager's ``hook`` relay, except that an event hook that raises is logged and counted.

    Event hooks are called through pluggy, so its ordering (``tryfirst``/``trylast``, then the plugin
    registered last first) and hook wrappers apply; each implementation is guarded so that one
    that raises is logged, counted and skipped while the others still run. Decision hooks
    (``firstresult``) go straight through: their errors reach the caller, which fails the affected
    request rather than the engine and counts the failure with `count_error`.
    """

    def __init__(self, pm: pluggy.PluginManager):
        self._pm = pm
        # Every registered event hook starts at 0, so its error count is exported before the first error.
        self.num_errors: dict[str, int] = {
            f"{impl.plugin_name}.{name}": 0
            for name, caller in vars(pm.hook).items()
            if isinstance(caller, pluggy.HookCaller)
            and not (caller.spec and caller.spec.opts.get("firstresult"))
            for impl in caller.get_hookimpls()
        }

    def __getattr__(self, name: str):
        caller = getattr(self._pm.hook, name)
        if caller.spec and caller.spec.opts.get("firstresult"):
            return caller
        return lambda **kwargs: self._announce(name, caller, kwargs)

    def count_error(self, plugin: str, hook: str) -> None:
        """Count one failure of ``plugin``'s ``hook`` (exported as ``spyglass:plugin_hook_errors_total``)."""
        key = f"{plugin}.{hook}"
        self.num_errors[key] = self.num_errors.get(key, 0) + 1

    def _announce(self, name: str, caller: pluggy.HookCaller, kwargs: dict[str, object]) -> None:
        for impl in caller.get_hookimpls():  # plugins may register at any time: guard the new ones
            if not (impl.hookwrapper or impl.wrapper or getattr(impl.function, _GUARDED, False)):
                impl.function = self._guarded(name, impl.plugin_name, impl.function)
        try:
            caller(**kwargs)
        except Exception:  # only a hook wrapper's own error gets here
            self.count_error("wrapper", name)
            log.exception("a hook wrapper of %s raised; the engine carries on", name)

    def _guarded(
        self, hook: str, plugin: str, function: Callable[..., object]
    ) -> Callable[..., object]:
        def guarded(*args: object) -> object:
            try:
                return function(*args)
            except Exception:
                self.count_error(plugin, hook)
                log.exception("plugin hook %s.%s raised; the engine carries on", plugin, hook)
                return None

        setattr(guarded, _GUARDED, True)
        return guarded


class SpyglassPluginManager(pluggy.PluginManager):
    """pluggy's plugin manager for one engine, knowing which engine (`context`) its plugins were made for."""

    def __init__(self, context: PluginContext):
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.context = context


def instantiate(plugin: object, context: PluginContext) -> object | None:
    """What to register for one engine: a module as it is (shared), else the factory's result for ``context``.

    A factory is a class or any other callable: it is called with the `PluginContext` and its
    result (None: nothing for this engine) is the engine's own plugin object.
    """
    if inspect.ismodule(plugin) or not callable(plugin):
        return plugin
    return plugin(context)


def create_plugin_manager(
    enabled: list[str] | None = None,
    disabled: list[str] | None = None,
    context: PluginContext | None = None,
) -> SpyglassPluginManager:
    """A plugin manager with every plugin of the ``spyglass`` entry-point group registered by name.

    ``enabled`` (if given) keeps only those names; ``disabled`` drops names. Built-in plugins
    come through the same entry points as third-party ones. An entry point naming a module
    registers the module; one naming a factory (a class or callable) registers what it returns
    when called with ``context``, so each engine (each plugin manager) has its own plugin objects
    and state. Without ``context``, one is made for a default `EngineConfig` with these plugins.
    """
    if context is None:
        context = PluginContext.for_config(
            EngineConfig(plugins=enabled, disabled_plugins=list(disabled or []))
        )
    pm = SpyglassPluginManager(context)
    available = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    unknown = [n for n in (enabled or []) + (disabled or []) if n not in available]
    if unknown:
        raise ValueError(f"unknown plugin(s) {unknown}; installed: {sorted(available)}")
    for name, entry_point in sorted(available.items()):
        if (enabled is not None and name not in enabled) or name in (disabled or []):
            continue
        try:
            loaded = entry_point.load()
        except Exception as error:  # an import error would otherwise name a module, not the plugin
            raise RuntimeError(
                f"plugin {name!r} ({entry_point.value}) could not be loaded: {error}"
            ) from error
        plugin = instantiate(loaded, context)
        if plugin is not None:
            pm.register(plugin, name=name)
    return pm


def describe_plugins(pm: pluggy.PluginManager) -> list[tuple[str, list[str]]]:
    """(plugin name, implemented hook names) for every registered plugin."""
    rows = []
    for name, plugin in pm.list_name_plugin():
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        rows.append((name, hooks))
    return rows
