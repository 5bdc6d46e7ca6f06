"""`aisched cancel --all-mine / --state` on a real service: one request cancels the pending
jobs at once and stops the running ones, and says how many it took."""

from __future__ import annotations

from harness import Service


def test_cancel_all_mine_by_state_on_a_real_service(service: Service) -> None:
    running = service.run("--gpus", "4", "--", "sleep", "100")
    service.wait_state(running, "running")
    pending = [service.run("--gpus", "1", "--", "sleep", "100") for _ in range(3)]
    out = service.cli("cancel", "--all-mine", "--state", "pending").stdout
    assert out == "3 job(s): 3 cancelled, 0 cancelling (tasks stopping)\n"
    assert [service.job(j)["state"] for j in [running, *pending]] == ["running"] + ["cancelled"] * 3
    out = service.cli("cancel", "--all-mine").stdout
    assert out == "1 job(s): 0 cancelled, 1 cancelling (tasks stopping)\n"
    assert service.wait_state(running, "cancelled")["message"] == "cancelled"
