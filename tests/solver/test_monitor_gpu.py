"""The Monitor's poll on a replica's device (skipped without two GPUs)."""
from __future__ import annotations

import pytest
import torch

from caffe_py.solver.monitor import Monitor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


def test_a_poll_from_another_devices_thread_waits_for_its_own_devices_copies():
    """The root's thread polls every replica's Monitor with cuda:0 current: the event that
    says the pinned copies are done is recorded on the replica's stream, behind its work."""
    monitor = Monitor(torch.device("cuda", 1), average_loss=1, checks=[], interval=1)
    with torch.cuda.device(0):
        monitor.record(0, torch.tensor(1.5, device="cuda:1"))
        with torch.cuda.device(1):
            torch.cuda._sleep(200_000_000)   # about 0.1 s of work ahead on cuda:1's stream
        monitor.poll(1)
        pending = monitor._pending
        assert pending is not None and not pending.event.query()
        torch.cuda.synchronize(1)
        assert pending.event.query()
        monitor.check_now()
        assert pending.losses[0].item() == 1.5 and monitor.checked == 1
