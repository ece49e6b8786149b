"""The ServerApp: FedAvg (optionally with SecAgg+) from x = 0, every round's model evaluated on
the public test file and its distance to x*, each line stamped with time.time() into the log."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import numpy as np
from flwr.common import Context, Message, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from efpsn_flower.model import accuracy, load_rows

app = ServerApp()


class PromptGrid(Grid):
    """The run's Grid with its send_and_receive polling for replies every `interval` s (flwr
    1.42's own sleeps 3 s between pulls); everything else is the Grid's own."""

    def __init__(self, grid: Grid, interval: float) -> None:
        self.grid, self.interval = grid, interval

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        waiting = set(self.grid.push_messages(messages))
        end = time.time() + (timeout or 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            got = list(self.grid.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting:
                break
            time.sleep(self.interval)
        return replies


def _fit_config(server_round: int) -> dict:
    return {"server_round": server_round}


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    x_test, y_test = load_rows(str(config["test-file"]), holdout=0.0, seed=0)
    optimum = np.load(str(config["optimum-file"]))
    classes, features = 10, x_test.shape[1]
    log_path = str(config["log-file"])

    def evaluate(server_round: int, arrays: list[np.ndarray], _config: dict):
        w, b = arrays
        flat = np.concatenate([w.ravel(), b])
        record = {"round": server_round, "time": time.time(),
                  "accuracy": accuracy(w, b, x_test, y_test),
                  "relative_deviation": float(np.linalg.norm(flat - optimum)
                                              / np.linalg.norm(optimum))}
        with open(log_path, "a") as out:
            out.write(json.dumps(record) + "\n")
        return 0.0, {"accuracy": record["accuracy"]}

    initial = [np.zeros((classes, features)), np.zeros(classes)]  # EFPSN's logreg starts at 0
    nodes = int(config["nodes"])
    strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=nodes,
                      min_available_clients=nodes, evaluate_fn=evaluate,
                      on_fit_config_fn=_fit_config,
                      initial_parameters=ndarrays_to_parameters(initial))
    legacy = LegacyContext(context=context,
                           config=ServerConfig(num_rounds=int(config["num-server-rounds"])),
                           strategy=strategy)
    fit = (SecAggPlusWorkflow(num_shares=int(config["num-shares"]),
                              reconstruction_threshold=int(config["reconstruction-threshold"]),
                              max_weight=float(config["max-weight"]))
           if bool(config["secagg"]) else None)
    poll = float(config["grid-poll"])  # 0: Flower's own send_and_receive
    DefaultWorkflow(fit_workflow=fit)(PromptGrid(grid, poll) if poll > 0 else grid, legacy)
