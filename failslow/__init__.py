"""failslow: find and fix fail-slow hardware in large distributed training jobs.

One installed namespace; the repository's top-level folders are its subpackages:

* ``failslow.detectors`` (``detectors/``): pure, clock-free analysis (numpy and friends only);
* ``failslow.agents`` (``agents/``): the SDK a training process calls, the node agent, telemetry
  sources; what ships into training environments;
* ``failslow.service`` (``service/``): the FastAPI service (event-time core, ingest, detection,
  incidents, actions, plans);
* ``failslow.harness`` (``harness/``): simulator, fault lab, demo and replay tools;
* ``failslow.migrations`` (``migrations/``): Alembic;
* ``failslow.cli``: the ``failslow`` command, composition root of all of them.

docs/architecture.md draws the layers and the data path.
"""

__version__ = "0.1.0"
