"""Start the replicas: ``spyglass serve --replicas N`` (``serve run`` uses `serve_run.app_builder`).

``spyglass serve --replicas 2 --num-threads 1`` joins the Ray cluster named by ``--ray-address``
(or ``RAY_ADDRESS``), or starts a local one, runs the application until SIGINT or SIGTERM, then
deletes it (and stops the local cluster it started). The same application as a ``serve run``
target: see `spyglass.core.cli.serve_run`.
"""

import argparse
import logging
import os
import signal
import threading

import ray
from ray import serve

from spyglass.core.api.server_options import ServerOptions
from spyglass.core.cli.engine_args import engine_config_from_args
from spyglass.core.replicas.deployments import build_application
from spyglass.telemetry.cli_options import settings_from_args

APP_NAME = "spyglass"
log = logging.getLogger("spyglass.replicas")


def application_from_args(args: argparse.Namespace, options: ServerOptions):
    """The Serve application that parsed ``spyglass serve`` options describe."""
    return build_application(
        engine_config_from_args(args, seed=args.seed),
        options,
        settings_from_args(args),
        num_replicas=args.replicas,
        replica_port=args.replica_port if args.replica_port is not None else options.port + 1,
        access_log=not args.disable_access_log,
    )


def serve_replicas(args: argparse.Namespace, options: ServerOptions) -> int:
    """Run the replicas behind ``options.host:port`` until a signal; 1 if the application failed to deploy."""
    local = not (
        args.ray_address or os.environ.get("RAY_ADDRESS")
    )  # else Ray and Serve are someone else's
    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    stop = threading.Event()
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
    ):  # after ray.init, which installs handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": options.host, "port": options.port})
        serve.run(
            application_from_args(args, options), name=APP_NAME, route_prefix="/", blocking=False
        )
        log.info("serving %d replicas on http://%s:%d", args.replicas, options.host, options.port)
        while not stop.wait(2):
            status = serve.status().applications.get(APP_NAME)
            if status is not None and status.status == "DEPLOY_FAILED":
                raise RuntimeError(status.message)
        log.info("stopping the replicas")
        serve.delete(APP_NAME)
        return 0
    except RuntimeError as error:  # what serve.run raises when a replica cannot start
        log.error("the replicas failed: %s", error)
        return 1
    finally:
        if local:
            serve.shutdown()
        ray.shutdown()
