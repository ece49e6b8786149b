#!/usr/bin/env python3
"""EFPSN on Docker Swarm: the stack file, each party's secrets, the node labels, a preflight check.

    python3 deploy/swarm/swarm.py stack --agents 3 > stack.yml      the stack for N agents
    python3 deploy/swarm/swarm.py secrets --name agent2 --dir DIR   DIR/agent2.key, agent2.pem
    python3 deploy/swarm/swarm.py secrets --name coordinator --dir DIR --ca   (+ DIR/ca.pem)
    python3 deploy/swarm/swarm.py label --node NODE --party agent2  agent2 runs on NODE
    python3 deploy/swarm/swarm.py check --agents 3                  secrets and labels in place?

`secrets` reads the files straight from the party's own folder (as written by `efpsn certs
request` and `sign`) into Swarm secrets named efpsn-NAME.key, efpsn-NAME.pem (and efpsn-ca.pem);
it writes no file. It first checks them with efpsn (key mode 0600, certificate of NAME from the
CA, matching the key), and `stack` takes the run parameters' variables from efpsn
(efpsn/cli/compose.py, as docker-compose.yml), so run those two with the Python that has efpsn
installed; `label` and `check` need only the standard library. Run it with the Docker CLI pointed at
a manager (DOCKER_HOST=ssh://..., or `docker context use`). `label` adds the node label
efpsn.party.NAME=true that the stack's placement constraint asks for; a node may carry several.
Everything else is plain `docker`. """

from __future__ import annotations

import argparse
import shutil
import stat
import subprocess
import sys
from pathlib import Path

PREFIX = "efpsn-"
LABEL = "efpsn.party."
UID = "10001"  # the images' user
PORTS = {"coordinator": 50050, "agent": 50051}

HEADER = """\
# EFPSN on Docker Swarm: a coordinator and {n} agents, each agent on its own party's node.
# Written by `python3 deploy/swarm/swarm.py stack --agents {n}` (edit that, not this file).
#
#   docker stack deploy --resolve-image never -c stack.yml efpsn
#
# Before: both images on every node that runs them (efpsn-coordinator:local, efpsn-agent:local;
# or set EFPSN_COORDINATOR_IMAGE / EFPSN_AGENT_IMAGE to images in your registry), the Swarm
# secrets efpsn-ca.pem, efpsn-NAME.pem and efpsn-NAME.key of every node (each party makes its
# own with `swarm.py secrets`), the node label efpsn.party.NAME=true on the node of each
# (`swarm.py label`), and on agentK's node its data in $EFPSN_DATA_ROOT/agentK/ (train.npz or
# train.csv) (default /srv/efpsn/data). `swarm.py check --agents {n}` tells what is missing.
# Each agent service lists only its own key, its certificate and the CA certificate (at
# /run/secrets/, owned by the images' user, the key mode 0400), mounts only its own data
# folder, read-only, and keeps its results and crash-safe state on its own volume
# (efpsn_results-agentK, on its node). A crashed agent is restarted with the same command and
# resumes; a finished one exits 0 and stays finished. Service names resolve by DNS round robin
# (endpoint_mode dnsrr): no virtual IPs, no IPVS needed. Run parameters come from the
# environment of `docker stack deploy`, as in docker-compose.yml.
version: "3.8"

x-restart: &restart
  condition: on-failure  # an agent that finished exits 0 and is left alone
  delay: 2s
  max_attempts: 5
  window: 120s

x-secret: &secret  # modes in decimal: YAML 1.1 and 1.2 read a leading 0 differently
  uid: "{uid}"
  gid: "{uid}"
  mode: 292  # 0o444

x-key: &key
  uid: "{uid}"
  gid: "{uid}"
  mode: 256  # 0o400: the images' user only

x-agent: &agent
  image: ${{EFPSN_AGENT_IMAGE:-efpsn-agent:local}}
  init: true
  networks: [efpsn]

services:
"""

COORDINATOR = """\
  coordinator:
    image: ${{EFPSN_COORDINATOR_IMAGE:-efpsn-coordinator:local}}
    init: true
    networks: [efpsn]
    secrets:
      - {{<<: *secret, source: ca.pem}}
      - {{<<: *secret, source: coordinator.pem}}
      - {{<<: *key, source: coordinator.key}}
    command:
      - --listen
      - 0.0.0.0:{port}
      - --tls-cert
      - /run/secrets/coordinator.pem
      - --tls-key
      - /run/secrets/coordinator.key
      - --tls-ca
      - /run/secrets/ca.pem
      - --agents
      - "{n}"
      - --data
      - local
      - --from-environment
    environment:  # every run parameter (efpsn.flags.names.run_parameter_variables)
{environment}
    healthcheck:
      test: [CMD, python, -m, efpsn.wire.healthcheck, --tls-dir, /run/secrets, --tls-name,
             coordinator, "127.0.0.1:{port}"]
      interval: 5s
      timeout: 10s
      retries: 12
      start_period: 60s
    deploy:
      endpoint_mode: dnsrr
      placement:
        constraints: [node.labels.{label}coordinator == true]
      restart_policy: *restart
"""

AGENT = """\
  {name}:
    <<: *agent
    secrets:  # only its own key
      - {{<<: *secret, source: ca.pem}}
      - {{<<: *secret, source: {name}.pem}}
      - {{<<: *key, source: {name}.key}}
    volumes:  # only its own data, read-only; its own results volume
      - {{type: bind, source: "${{EFPSN_DATA_ROOT:-/srv/efpsn/data}}/{name}", target: /data,
         read_only: true}}
      - {{type: volume, source: results-{name}, target: /results}}
    command: [--name, {name}, --listen, "0.0.0.0:{port}", --advertise, "{name}:{port}",
              --coordinator, "coordinator:{coordinator_port}",
              --tls-cert, /run/secrets/{name}.pem, --tls-key, /run/secrets/{name}.key,
              --tls-ca, /run/secrets/ca.pem, --results, /results, --data, /data]
    deploy:
      endpoint_mode: dnsrr
      placement:
        constraints: [node.labels.{label}{name} == true]
      restart_policy: *restart
"""


def agent_names(count: int) -> list[str]:
    if count < 2:
        raise ValueError(f"a network needs at least 2 agents, got {count}")
    return [f"agent{k}" for k in range(1, count + 1)]


def render_stack(count: int) -> str:
    """The stack file (compose format 3.8) for a coordinator and agent1..agentCOUNT."""
    from efpsn.cli.compose import DEFAULTS, compose_variables

    names = agent_names(count)
    environment = "\n".join(f"      {v}: ${{{v}:-{DEFAULTS.get(v, '')}}}"
                            for v in compose_variables())
    out = [HEADER.format(n=count, uid=UID),
           COORDINATOR.format(n=count, port=PORTS["coordinator"], environment=environment,
                              label=LABEL)]
    out += [AGENT.format(name=name, port=PORTS["agent"], coordinator_port=PORTS["coordinator"],
                         label=LABEL) for name in names]
    out.append("\nnetworks:\n  efpsn:\n    driver: overlay\n")
    out.append("\nvolumes:  # one per agent, on its node\n")
    out += [f"  results-{name}: {{}}\n" for name in names]
    out.append("\nsecrets:  # made by `swarm.py secrets`, each by its own party\n")
    for name in ["ca", "coordinator", *names]:
        suffixes = (".pem",) if name == "ca" else (".pem", ".key")
        out += [f"  {name}{s}: {{external: true, name: {PREFIX}{name}{s}}}\n" for s in suffixes]
    return "".join(out)


# ------------------------------------------------------------------------------- docker


def docker(*args: str, data: bytes | None = None, check: bool = True
           ) -> subprocess.CompletedProcess[bytes]:
    binary = shutil.which("docker")
    if not binary:
        raise RuntimeError("no docker client on PATH")
    proc = subprocess.run([binary, *args], input=data, capture_output=True, check=False)
    if check and proc.returncode != 0:
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"docker {args[0]} {args[1]}: "
                           f"{message[-1] if message else f'exit code {proc.returncode}'}")
    return proc


def _check_material(folder: Path, name: str, *, with_ca: bool) -> None:
    """The key is private (0600) and the certificate in the folder belongs to it and to ca.pem."""
    key = folder / f"{name}.key"
    if not key.is_file():
        raise ValueError(f"no {key} (make it on this host: efpsn certs request --name {name} "
                         f"--out {folder})")
    if stat.S_IMODE(key.stat().st_mode) & 0o077:
        raise ValueError(f"{key} is readable by others (mode "
                         f"{stat.S_IMODE(key.stat().st_mode):o}): chmod 600 it")
    try:
        from efpsn.wire.tls import TlsConfig
    except ImportError:
        raise ValueError("the efpsn package is needed to check the files: run this with the "
                         "Python that has it installed") from None
    TlsConfig.from_dir(folder, name).require_name(name)
    if with_ca and not (folder / "ca.pem").is_file():
        raise ValueError(f"no {folder / 'ca.pem'}")


def make_secrets(folder: Path, name: str, *, with_ca: bool) -> list[str]:
    """Swarm secrets from FOLDER/NAME.key and NAME.pem (and ca.pem): created from the files
    where they are, labelled with the party's name. Returns the secrets' names."""
    _check_material(folder, name, with_ca=with_ca)
    made = []
    files = [(f"{PREFIX}{name}.pem", folder / f"{name}.pem"),
             (f"{PREFIX}{name}.key", folder / f"{name}.key")]
    if with_ca:
        files.insert(0, (f"{PREFIX}ca.pem", folder / "ca.pem"))
    for secret, path in files:
        docker("secret", "create", "--label", f"efpsn.party={name}", secret, str(path))
        made.append(secret)
    return made


def label_node(node: str, parties: list[str]) -> None:
    args = [arg for party in parties for arg in ("--label-add", f"{LABEL}{party}=true")]
    docker("node", "update", *args, node)


def missing(count: int) -> list[str]:
    """What `docker stack deploy` of render_stack(count) would miss: secrets and labels."""
    names = ["coordinator", *agent_names(count)]
    have = set(docker("secret", "ls", "--format", "{{.Name}}").stdout.decode().split())
    want = [f"{PREFIX}ca.pem"] + [f"{PREFIX}{n}{s}" for n in names for s in (".pem", ".key")]
    out = [f"secret {s}" for s in want if s not in have]
    nodes = docker("node", "ls", "--format", "{{.ID}}").stdout.decode().split()
    labels: set[str] = set()
    for node in nodes:
        shown = docker("node", "inspect", "--format",
                       "{{range $k, $v := .Spec.Labels}}{{$k}}={{$v}} {{end}}", node)
        labels.update(shown.stdout.decode().split())
    out += [f"node label {LABEL}{n}=true" for n in names if f"{LABEL}{n}=true" not in labels]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swarm.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    stack = sub.add_parser("stack", help="print (or --out) the stack file for N agents")
    stack.add_argument("--agents", type=int, required=True)
    stack.add_argument("--out", default=None)
    secrets = sub.add_parser("secrets", help="Swarm secrets of one node from its own folder")
    secrets.add_argument("--name", required=True, help="coordinator or agentK")
    secrets.add_argument("--dir", required=True, help="the folder with NAME.key, NAME.pem")
    secrets.add_argument("--ca", action="store_true", help="also efpsn-ca.pem from DIR/ca.pem")
    label = sub.add_parser("label", help="place these parties' services on NODE")
    label.add_argument("--node", required=True, help="node name or id (docker node ls)")
    label.add_argument("--party", action="append", required=True, help="repeatable")
    check = sub.add_parser("check", help="list the secrets and labels still missing")
    check.add_argument("--agents", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "stack":
            text = render_stack(args.agents)
            if args.out:
                Path(args.out).write_text(text)
            else:
                sys.stdout.write(text)
        elif args.command == "secrets":
            for secret in make_secrets(Path(args.dir), args.name, with_ca=args.ca):
                print(f"secret {secret}")
        elif args.command == "label":
            label_node(args.node, args.party)
            print(f"{args.node}: {', '.join(f'{LABEL}{p}=true' for p in args.party)}")
        else:
            gaps = missing(args.agents)
            print("\n".join(f"missing {g}" for g in gaps) or "ready to deploy")
            return 1 if gaps else 0
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"swarm.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
