"""The ServerApp: FedAvg (optionally with SecAgg+) from x = 0, every round's model evaluated on
the public test file and its distance to x*, each line stamped with time.time() into the log."""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from efpsn_flower.model import accuracy, load_rows

app = ServerApp()


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
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
