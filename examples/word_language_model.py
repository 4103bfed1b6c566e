"""pytorch/examples' word_language_model on the runtime: an LSTM language model trained with
manual SGD, dropout and gradient clipping, the hidden state carried across batches, an evaluation
each epoch, the best model exported, and the learning rate divided by 4 when the validation loss
stops improving. Kill it anywhere and rerun: it resumes bit-exactly.

What the runtime does that the original program writes by hand: the epoch evaluation
(`EvaluationHook`, on the live model, RNG and train/eval modes untouched), the best-model save
(`BestExporter`, atomic, remembered across restarts), and the loop variables — learning rate,
best loss, carried hidden state — checkpointed as they are (`LoopState`). The data position is
the global step. The corpus is a small synthetic language (a fixed random Markov chain over 50
words), so it runs offline in seconds.

    python examples/word_language_model.py --logdir runs/wlm     # 6 epochs; rerun to resume
"""
from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn

from hooks import EvaluationHook, StopAtStepHook
from supervisor import Hook, LoopState, MonitoredTrainingSession
from supervisor.estimator import BestExporter
from supervisor.estimator.exporters import list_exports


def synthetic_corpus(tokens: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    """Token ids of a fixed random Markov chain: each word has a few likely successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.softmax(3 * torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1234)), 1)
    ids = [0]
    for _ in range(tokens - 1):
        ids.append(int(torch.multinomial(successors[ids[-1]], 1, generator=g)))
    return torch.tensor(ids)


class RNNModel(nn.Module):
    """Embedding, LSTM, dropout, decoder: the original's ``RNNModel('LSTM', ...)``."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.ntoken, self.nlayers, self.nhid = ntoken, nlayers, nhid
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        return self.decoder(self.drop(output)).view(-1, self.ntoken), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(self.nlayers, bsz, self.nhid), torch.zeros(self.nlayers, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    return data[:data.size(0) // bsz * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class DecayOnPlateau(Hook):
    """After each evaluation: a new best loss is kept, else the learning rate is divided by 4.
    Listed after the `EvaluationHook`, it runs before the step's checkpoint, which holds it."""

    def __init__(self, evaluation: EvaluationHook, loop: LoopState) -> None:
        self.evaluation, self.loop = evaluation, loop

    def after_run(self, run_context, run_values):
        metrics = self.evaluation.last_metrics
        if metrics is None or metrics["global_step"] != run_context.session.global_step:
            return
        if metrics["loss"] < self.loop.best_val:
            self.loop.best_val = metrics["loss"]
        else:
            self.loop.lr /= 4.0


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/word_language_model")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--save-steps", type=int, default=10, help="checkpoint every this many steps")
    args = parser.parse_args(argv)
    torch.manual_seed(1111)
    train, val, test = (batchify(synthetic_corpus(n, seed=s), b) for n, s, b in
                        ((20000, 1, 20), (3000, 2, 10), (3000, 3, 10)))
    model = RNNModel(50, 32, 32, 2, dropout=0.2)
    criterion = nn.CrossEntropyLoss()
    steps_per_epoch = math.ceil((train.size(0) - 1) / args.bptt)

    def eval_batches(source=val):  # one pass, the hidden state carried from batch to batch
        hidden = [model.init_hidden(source.size(1))]
        for i in range(0, source.size(0) - 1, args.bptt):
            yield hidden, get_batch(source, i, args.bptt)

    def eval_step(model, batch):
        hidden, (data, targets) = batch
        output, hidden[0] = model(data, hidden[0])
        return {"loss": criterion(output, targets)}

    loop = LoopState(lr=args.lr, best_val=float("inf"), hidden=None)
    evaluation = EvaluationHook(eval_batches, eval_step, every_n_steps=steps_per_epoch, exporters=[BestExporter()])

    def train_step(step: int) -> dict[str, torch.Tensor]:
        i = step % steps_per_epoch * args.bptt  # the data position is the global step
        data, targets = get_batch(train, i, args.bptt)
        model.zero_grad()
        output, hidden = model(data, model.init_hidden(train.size(1)) if i == 0 else loop.hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-loop.lr)
        loop.hidden = tuple(h.detach() for h in hidden)
        return {"loss": loss}

    with MonitoredTrainingSession(args.logdir, model=model, state={"loop": loop}, save_checkpoint_steps=args.save_steps,
                                  hooks=[evaluation, DecayOnPlateau(evaluation, loop),
                                         StopAtStepHook(last_step=args.epochs * steps_per_epoch)]) as s:
        while not s.should_stop():
            s.run(train_step, s.global_step)

    _, best = list_exports(os.path.join(args.logdir, "export", "best_exporter"))[-1]  # the original's --save
    model.load_state_dict(torch.load(os.path.join(best, "model.pt"), weights_only=True))
    model.eval()
    with torch.no_grad():
        losses = [float(eval_step(model, batch)["loss"]) for batch in eval_batches(test)]
    test_loss = sum(losses) / len(losses)
    print(f"best valid loss {loop.best_val:.3f} | lr {loop.lr:g} | test loss {test_loss:.3f} | "
          f"test ppl {math.exp(test_loss):.2f}")
    return {"best_val": loop.best_val, "lr": loop.lr, "test_loss": test_loss}


if __name__ == "__main__":
    main()
