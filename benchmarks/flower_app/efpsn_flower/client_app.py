"""The ClientApp: one agent's local SGD on its own folder (numpy only; a process per message)."""

from __future__ import annotations

import numpy as np
from flwr.app.message_type import MessageType
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

from efpsn_flower.model import load_rows, local_sgd


class LogisticClient(NumPyClient):
    """Local epochs of SGD from the server's model on this node's training rows."""

    def __init__(self, context: Context) -> None:
        self.config = context.run_config
        self.x, self.y = load_rows(str(context.node_config["data"]),
                                   holdout=float(self.config["holdout"]),
                                   seed=int(self.config["seed"]))
        self.node = int(context.node_config["node"])

    def fit(self, parameters: list[np.ndarray], config: dict) -> tuple:
        w, b = parameters
        round_ = int(config.get("server_round", 0))
        rng = np.random.default_rng([int(self.config["seed"]), self.node, round_])
        w, b = local_sgd(w, b, self.x, self.y, epochs=int(self.config["local-epochs"]),
                         batch=int(self.config["batch-size"]),
                         lr=float(self.config["learning-rate"]), l2=float(self.config["l2"]),
                         rng=rng)
        return [w, b], len(self.y), {}


def client_fn(context: Context):
    return LogisticClient(context).to_client()


def secagg_when_asked(msg: Message, ctxt: Context, call_next):
    """secaggplus_mod for the SecAgg+ workflow's messages, the plain client otherwise (one
    ClientApp serves both variants)."""
    if msg.metadata.message_type == MessageType.TRAIN:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None and Key.STAGE in configs:
            return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


app = ClientApp(client_fn=client_fn, mods=[secagg_when_asked])
