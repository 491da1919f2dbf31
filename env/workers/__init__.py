"""The worker pool: the `Worker` contract (base.py) and its backends.

api.py (retries, keys, prices) with openai_api.py, anthropic_api.py, google_api.py; local.py (transformers);
simulated.py and replay.py (world-model workers); cache.py (SQLite response cache). Backends are imported from
their modules so that using one does not import every provider SDK.
"""
