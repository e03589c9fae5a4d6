"""tests/peers: the rows the comparisons record are saved at the end of the session when
`python -m tests.peers.table` asked for them."""

from tests.peers.table import save


def pytest_sessionfinish(session, exitstatus):
    save()
