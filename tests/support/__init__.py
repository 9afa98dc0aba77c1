"""What the tests share, imported as ``tests.support.<module>`` (fixtures live in the conftest files).

* :mod:`.ports` — a free loopback port;
* :mod:`.waiting` — bounded waits: for a condition, an HTTP endpoint, the agent's event loop;
* :mod:`.inprocess` — an ASGI app (the agent) served by uvicorn in a thread of the test process;
* :mod:`.agent_process` — ``icos-agent serve`` as a subprocess;
* :mod:`.settings` — agent settings and configs for the shipped MNIST CNN;
* :mod:`.v2` — V2 request bodies, CloudEvents headers, requests and label posts;
* :mod:`.traffic` — concurrent clients recording which predictions were acknowledged;
* :mod:`.metrics` — a ``/metrics`` exposition, parsed;
* :mod:`.prometheus`, :mod:`.postgres`, :mod:`.mlflow` — real servers, started and stopped (PostgreSQL: one
  per test process, a fresh database per test);
* :mod:`.mounts` — small tmpfs file systems and unwritable directories for fault tests;
* :mod:`.requirements` — servers and tools a test needs: a skip locally, an error under ``CI=true``;
* :mod:`.agents` — agents started for a test or a module and stopped after it (``agents``, ``module_agents``);
* :mod:`.mnist` — the shared MNIST bundle; :mod:`.digits` — the digits model and its bundle;
  :mod:`.demo` — the demo; each made once per run (:mod:`.once`, however many xdist workers);
* :mod:`.batches` — prediction batches for the store's tests;
* :mod:`.estimates` — two ``icos_agent`` estimates compared as the equality guarantee states it;
* :mod:`.parallel` — the xdist plan: modules that share a fixture stay on one worker, the demo in the background.
"""
