"""Federated averaging from Python: the C++ runtime moves the weights, a
Python Trainer trains the model.

    class MyTrainer(xsilo.fl.TorchTrainer):
        def train(self, epochs, steps):   # local training, then
            return {"samples": n, "loss": mean_loss}
        def evaluate(self):
            return {"loss": l, "accuracy": a, "samples": n}

    # server (rank 0): any party holding the initial model
    report = xsilo.fl.run_server(transport, model.state_dict(), rounds=3)
    # client (rank > 0)
    xsilo.fl.run_client(transport, MyTrainer(model))

The server can equally be `xsilo fl server` when the model is its built-in
MLP; a Python server is needed for any other model.
"""

from collections import OrderedDict

from . import _xsilo


class Trainer(_xsilo._Trainer):
    """What a FedAvg client calls. Subclasses define:

    get_parameters() -> {name: tensor}   float32 torch/numpy/xsilo tensors
    set_parameters(tensors)              {name: xsilo.Tensor} of the global model
    train(epochs, steps) -> {"samples": int > 0, "loss": float, ...}
    evaluate() -> {"loss": float, "accuracy": float, "samples": int}

    The runtime calls them from its own thread, one at a time, holding the
    GIL only while each runs. An exception fails the client's run with it.
    """

    def __init__(self):
        _xsilo._Trainer.__init__(self)


class TorchTrainer(Trainer):
    """A Trainer around a torch.nn.Module: parameters are its state_dict.

    set_parameters copies the received weights into the model (the received
    bytes are shared, so the model never writes into them); get_parameters
    hands out detached clones, because the optimizer of the next round
    writes into the model's own tensors while the update may still be in
    flight. Subclasses define train() and evaluate().
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def get_parameters(self):
        return OrderedDict(
            (k, v.detach().clone()) for k, v in self.model.state_dict().items()
        )

    def set_parameters(self, tensors):
        state = OrderedDict((k, t.torch()) for k, t in tensors.items())
        self.model.load_state_dict(state, strict=True)


def _quorum(quorum):
    """0.5 -> (0.5, 0): a fraction of the selected clients; 3 -> (0, 3): a count."""
    if isinstance(quorum, bool):
        raise ValueError("quorum must be a fraction in [0, 1] or a count of clients")
    if isinstance(quorum, int):
        if quorum < 0:
            raise ValueError("quorum count must be >= 0")
        return 0.0, quorum
    q = float(quorum)
    if not 0.0 <= q <= 1.0:
        raise ValueError("quorum fraction must lie in [0, 1]")
    return q, 0


def run_server(transport, initial_model, rounds=3, clients_per_round=0, quorum=0.5,
               round_deadline=600.0, finish_deadline=60.0, local_steps=10, local_epochs=0,
               max_failed_rounds=3, seed=1, finish=True, on_round=None, checkpoint_dir=""):
    """Runs FedAvg rounds on a started rank-0 transport.

    initial_model: {name: float32 tensor}, e.g. model.state_dict(). Each
    round broadcasts the model to the selected clients and averages their
    updates by sample count; a round counts when `quorum` answered.
    on_round(report_dict) is called after each round. checkpoint_dir: write
    the global model and the next round there after every round, and resume
    from what a previous (crashed) server left there. Returns a dict:
    rounds (list of per-round dicts), final_evaluation, model ({name:
    xsilo.Tensor}; .torch() each for a state_dict).
    """
    fraction, count = _quorum(quorum)
    return _xsilo._run_server(
        transport, dict(initial_model), int(rounds), int(clients_per_round), fraction, count,
        float(round_deadline), float(finish_deadline), int(local_steps), int(local_epochs),
        int(max_failed_rounds), int(seed), bool(finish), on_round, str(checkpoint_dir))


def run_client(transport, trainer, idle_timeout=3600.0, send_timeout=600.0):
    """Serves rounds on a started client transport until the server finishes
    the job. Returns a dict: rounds_trained, final_evaluation, ..."""
    if not isinstance(trainer, _xsilo._Trainer):
        raise ValueError("trainer must be an xsilo.fl.Trainer")
    return _xsilo._run_client(transport, trainer, float(idle_timeout), float(send_timeout))
