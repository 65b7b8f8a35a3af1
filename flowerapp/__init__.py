"""fedsieve at real sites: a Flower ClientApp for each site and a ServerApp for the hub,
run by Flower's Deployment Runtime (SuperLink, SuperNodes; docs/federation.md).

Only :mod:`flowerapp.client_app`, :mod:`flowerapp.server_app` and :mod:`flowerapp.remote`
import Flower: they run in the Flower environment (``make setup-flower``), which holds
the engine, torch and Flower, no Prefect, MLflow or DVC. :mod:`flowerapp.site_data`,
:mod:`flowerapp.hub` and :mod:`flowerapp.certs` are imported by the hub's pipeline too.
"""

from flowerapp import timing as _timing  # noqa: F401 (first: when the app's imports began)
