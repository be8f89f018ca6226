"""The leader keeps its Lease while a quarter and more of its Lease calls fail: the
real API server behind the fault-injecting proxy (429s, 500s, dropped connections)."""

from __future__ import annotations

import threading
import time
import uuid

from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster
from sdcdev.faultproxy import FaultProxy, FaultRates
from sdcdev.harness import wait_for
from sdcguard.runtime.leader import LeaderElector

NS = "default"
# Harsher than the scale benchmark's start-up faults (a quarter of requests).
LEASE_FAULTS = FaultRates(
    drop=0.10,
    error_500=0.15,
    error_429=0.15,
    conflict_409=0.0,
    lost_response=0.0,
    delay=0.0,
    max_delay_s=0.0,
    cut_watch=0.0,
)
HELD_S = 25.0


def test_a_leader_keeps_its_lease_through_failing_lease_calls(
    cluster: LocalCluster, api_client: client.ApiClient
) -> None:
    """Four Lease requests in ten fail. Without the retries inside a call, the same
    faults ended the leadership three times in 87 s (a renewal is a read and a
    replace, and the 5 s deadline leaves room for five tries a second apart); with
    them the leader renews throughout and never stops leading."""
    name = f"faults-{uuid.uuid4().hex[:6]}"
    lost = threading.Event()
    proxy = FaultProxy(cluster.server, cluster.ca_file, cluster.token, seed=11, rates=LEASE_FAULTS)
    with proxy as p:
        proxied = client.ApiClient(client.Configuration(host=p.url))
        elector = LeaderElector(
            proxied,
            namespace=NS,
            name=name,
            identity="faulted",
            lease_duration=8,
            renew_deadline=5,
            retry_period=1,
            on_lost=lost.set,
        )
        elector.start()
        try:
            wait_for(elector.elected.is_set, 60, "the first election")
            gaps: list[float] = []
            last = time.monotonic()
            end = last + HELD_S
            while time.monotonic() < end and not lost.is_set():
                assert elector.leading(), "the fence dropped while the Lease was held"
                renewed = elector._lock.renewed_at
                assert renewed is not None
                if renewed > last:
                    gaps.append(renewed - last)
                    last = renewed
                time.sleep(0.1)
            injected = dict(p.injected)
        finally:
            elector.release()
    assert not lost.is_set(), f"the leader lost its Lease (faults injected: {injected})"
    # The faults were there: every kind was drawn many times over the renewals.
    assert sum(injected.values()) >= 10, injected
    assert {"500", "429", "drop"} <= set(injected), injected
    # It renewed throughout (about once a second), never near the deadline.
    assert len(gaps) >= HELD_S / 3, gaps
    assert max(gaps) < 5, gaps
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(name, NS)
    assert lease.spec.holder_identity in (None, "")  # released at the end
