"""``spyglass plugins``: which plugins are installed and which hooks each implements."""

from spyglass.core.engine.plugin_manager import create_plugin_manager, describe_plugins


def add_parser(subparsers, argv) -> None:
    """Register the command."""
    parser = subparsers.add_parser("plugins", help="list loaded plugins and their hooks")
    parser.add_argument(
        "--plugins", default=None, help="comma-separated plugin names to enable (default: all)"
    )
    parser.add_argument(
        "--disable-plugins", default="", help="comma-separated plugin names to disable"
    )
    parser.set_defaults(run=run)


def run(args) -> int:
    """Print one line per plugin."""
    enabled = [p for p in args.plugins.split(",") if p] if args.plugins is not None else None
    pm = create_plugin_manager(enabled, [p for p in args.disable_plugins.split(",") if p])
    for name, hooks in describe_plugins(pm):
        print(f"{name}: {', '.join(hooks) or '(no hooks)'}")
    return 0
