"""Engine replicas on Ray Serve behind one OpenAI-compatible ingress, routed by prompt prefix.

``spyglass serve --replicas N`` (or ``serve run spyglass.core.cli.serve_run:app_builder``) starts:

- N `EngineReplica` deployments, each the ordinary Spyglass app (engine, API, ``/metrics``) in a
  Ray actor, listening on its own port too (``--replica-port`` + its rank) for scrapes and probes;
- one `Ingress` deployment behind Ray Serve's HTTP proxy that forwards every API call, streams
  included, to a replica through a `DeploymentHandle`;
- `PrefixAffinityRouter`, a Ray Serve request router that sends a request to the replica that
  served the longest run of its prompt's leading blocks, or by load when none did or that one is
  too busy.

Only `prefix` and `forward` are importable without Ray; Ray itself is an optional dependency
(the ``ray`` extra), imported when a command asks for replicas.
"""
