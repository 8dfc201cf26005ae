"""Written into PEFT's tests/ by ecosystem/peer_suites.py (PEFT's sdist ships no conftest.py).

PEFT's ``hub_online_once(model_id)`` turns the Hub back on for the first use of each model id; on a
machine without the Hub each such test then spends about 48 s in retries before it fails. Every id
counts as seen already, so those tests stay offline and fail at once, on both sides alike.
"""

from . import testing_utils


class _SeenAlready(dict):
    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> int:
        return dict.get(self, key, 1)


testing_utils._HUB_MODEL_ACCESSES = _SeenAlready()
