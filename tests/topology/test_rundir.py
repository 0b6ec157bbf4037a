"""The run-dir layout the topology runner and the control plane share."""

from runtime.topology.rundir import PopEntry, RunState, pop_dir, pop_names, read_state, write_state


def test_state_round_trips_and_names_come_from_data_dirs(tmp_path):
    assert read_state(tmp_path) is None and pop_names(tmp_path) == []
    state = RunState(source="topology.toml", pops=[
        PopEntry(name="edge-eu", tier="edge", geo="eu-west", region="eu", parents=["reg-eu"]),
        PopEntry(name="central", tier="central")])
    write_state(tmp_path, state)
    for entry in state.pops:
        pop_dir(tmp_path, entry.name).mkdir(parents=True)
    assert read_state(tmp_path) == state
    assert pop_names(tmp_path) == ["central", "edge-eu"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_pop_that_exits_while_starting_is_reported_with_its_logs_last_lines(tmp_path):
    from runtime.topology.runner import _tail

    log = tmp_path / "pop.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert _tail(log) == "".join(f"\n    line {i}" for i in range(12, 20))
    assert _tail(tmp_path / "gone.log") == ""  # its run folder went first


def test_ports_for_a_topology_come_from_below_the_ephemeral_range_and_never_twice():
    """An outgoing connection of any process takes its port from the ephemeral range,
    so a port chosen there could be taken before the PoP binds it."""
    import socket
    from pathlib import Path

    from runtime.topology.plan import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200 and all(1024 <= p < low for p in ports)
    with socket.socket() as s:  # each was free when it was chosen
        s.bind(("127.0.0.1", ports[-1]))
