"""The replicas as a Ray Serve ``serve run`` target, with ``spyglass serve``'s options as ``key=value``::

serve run spyglass.core.cli.serve_run:app_builder replicas=2 num-threads=1 kv-cache-memory=512MiB
"""

from spyglass.core.cli.main import build_parser
from spyglass.core.cli.replicas import application_from_args
from spyglass.core.cli.serve_command import server_options_from_args


def app_builder(arguments: dict[str, str]):
    """``serve run`` builder: ``key=value`` arguments are ``spyglass serve --key value`` options.

    ``replicas`` defaults to 2; ``true`` as a value gives a bare flag (``disable-access-log=true``).
    """
    argv = ["serve"]
    for key, value in {"replicas": "2", **arguments}.items():
        flag = "--" + key.replace("_", "-")
        argv += (
            [flag] if value.lower() == "true" else [] if value.lower() == "false" else [flag, value]
        )
    args = build_parser(argv).parse_args(argv)
    return application_from_args(args, server_options_from_args(args))
