"""Planted attention bugs: the catalogue the doctor's verdicts are measured against (bench/diagnosis.py,
tests/test_planted_bugs.py).

    python -m bench.catalogue.bugs    # lists the catalogue: name, expected verdict, kinds, what the bug does
    make docs                           # writes it, and the checks' verdicts (monitor/units.py), into docs/DOCTOR.md

A bug is a small function registered by name with the verdict the doctor should give. It plants itself through a
`Plant`, from outside the code it tests (nothing in model/, training/, inference/ or the rest of monitor/ imports it):

    plant.network(d_head=256)              NetworkConfig values the run is built with
    plant.replace(original, replacement)   every module attribute that *is* `original` (model.attention.attention,
                                           model.attention.attention_mask, ...) points to `replacement` while the
                                           run lasts, then back
    plant.module(edit)                     edit(ClassifierModule) once it is built, before training: its hparams
                                           (the learning rate), its network(s)
    plant.layers(edit)                     edit(layer) for every attention layer of every network the module trains
                                           or evaluates (with ema_decay: both), e.g. a mask of its own

Your own bug, in your own module:

    from bench.catalogue.bugs import bug

    @bug(expects="padding-leak")
    def my_bug(plant):
        "Every key visible: the padding mask dropped."
        plant.layers(lambda layer: setattr(layer, "mask", lambda padding, L, device=None: None))

    python -m bench.diagnosis --bugs my_module:my_bug

Groups: "catalogue" (the bug classes the doctor's checks were designed for), "field" (mask bugs seen in public
code), "contract" (one bug for each contract check that no figure of attention shows: a weight that never learns, a
setting that breaks the formula, padding that reaches a prediction outside attention, a block around attention
written otherwise, a weight assigned twice, an optimizer other than the configured one), "outside" (bugs no check was
designed for: any warning is right, silence is wrong). `expects` is the verdict (or verdicts) that name the cause;
None means any warning. `kinds` says which attention kinds the bug means
something for, as a rule on the kind's class (read from the registry when asked, so a kind registered later is
included) or a tuple of names: a padding bug cannot leak into linformer's projected keys (padded keys are zeros
before the projection whatever the mask says).
"""

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

import model.attention as core
from data.files import describe
from model.attention import AttentionWeights
from model.kinds import ATTENTION_KINDS

GROUPS = ("catalogue", "field", "contract", "outside", "heldout")
log = logging.getLogger(__name__)


def every_kind(kind: type) -> bool:
    return True


def masked_kinds(kind: type) -> bool:
    """Kinds whose keys are tokens of the text (not linformer's projections): the only ones a mask bug can reach."""
    return kind.keys_are_tokens


@dataclass(frozen=True)
class Bug:
    name: str
    plant: Callable[["Plant"], None]
    expects: tuple[str, ...] = ()  # verdicts that name its cause; empty: any warning does
    group: str = "catalogue"
    applies_to: Callable[[type], bool] | tuple[str, ...] = every_kind  # a rule on a kind's class, or kind names

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds the bug means something for, among those registered when asked (model/kinds.py)."""
        if isinstance(self.applies_to, tuple):
            return self.applies_to
        return tuple(name for name, kind in ATTENTION_KINDS.items() if self.applies_to(kind))

    @property
    def summary(self) -> str:
        """The first paragraph of the bug function's docstring, on one line."""
        return " ".join((self.plant.__doc__ or "").strip().split("\n\n")[0].split())


BUGS: dict[str, Bug] = {}


def bug(expects: str | tuple[str, ...] | None = None, *, group: str = "catalogue", kinds=every_kind, name=None):
    """Registers the decorated function as a bug under its name (or `name`); expects: the verdict(s) the doctor
    should give, None for any warning."""
    if group not in GROUPS:
        raise ValueError(f"bug group must be one of {', '.join(GROUPS)}, got {group!r}")

    def register(function):
        expected = () if expects is None else (expects,) if isinstance(expects, str) else tuple(expects)
        entry = Bug(name or function.__name__.replace("_", "-"), function, expected, group,
                    kinds if callable(kinds) else tuple(kinds))
        BUGS[entry.name] = function.bug = entry
        return function

    return register


def load_bug(spec: str) -> Bug:
    """A registered name, or `module:function` from the user's own module (decorated with @bug, or a plain function
    of a Plant: then any warning counts). A bad spec is a ValueError naming it."""
    if ":" not in spec:
        if spec not in BUGS:
            raise ValueError(f"--bugs {spec}: no such bug (known: {', '.join(BUGS)}; or give module:function)")
        return BUGS[spec]
    module_name, _, function_name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (Exception, SystemExit) as e:  # the user's module may fail in any way: a syntax error, an exception or
        # sys.exit() at import, a missing function
        raise ValueError(f"--bugs {spec}: cannot load it ({describe(e)})") from None
    if not callable(function):
        raise ValueError(f"--bugs {spec}: {function_name} is not a function")
    return getattr(function, "bug", None) or Bug(spec, function, group="outside")


class Plant:
    """What one bug changes in one run. bench/diagnosis.py builds the run with `flags()`, calls `edit(module)` on the
    built ClassifierModule, and trains inside `applied()`."""

    def __init__(self):
        self.settings: dict = {}
        self.replacements: list[tuple[object, object]] = []
        self.edits: list[Callable] = []

    def network(self, **settings) -> None:
        self.settings.update(settings)

    def replace(self, original, replacement) -> None:
        self.replacements.append((original, replacement))

    def module(self, edit: Callable) -> None:
        self.edits.append(edit)

    def layers(self, edit: Callable) -> None:
        self.module(lambda module: [edit(layer) for layer in attention_layers(module)])

    def flags(self) -> list[str]:
        """The network settings as train.py flags."""
        return [arg for name, value in self.settings.items() for arg in (f"--model.network.{name}", flag(value))]

    def edit(self, module) -> None:
        for edit in self.edits:
            edit(module)

    @contextmanager
    def applied(self) -> Iterator[None]:
        with replaced(self.replacements):
            yield


def flag(value) -> str:
    """A setting's value as train.py reads it on the command line."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


@contextmanager
def replaced(replacements: list[tuple[object, object]]) -> Iterator[None]:
    """Every attribute of every loaded module that is `original` points to its replacement inside the block; all are
    put back after it, even when the block raises."""
    changed = []
    try:
        for original, replacement in replacements:
            places = [(module, attribute) for module in list(sys.modules.values())
                      for attribute, value in list(getattr(module, "__dict__", {}).items()) if value is original]
            if not places:
                raise ValueError(f"nothing in the loaded modules is {original!r}: nothing to replace")
            for module, attribute in places:
                setattr(module, attribute, replacement)
                changed.append((module, attribute, original))
        yield
    finally:
        for module, attribute, original in reversed(changed):
            setattr(module, attribute, original)


def networks(module) -> list:
    """The networks a ClassifierModule holds (training/average.py networks; imported here, where a module exists:
    the catalogue loads no Lightning of its own)."""
    from training.average import networks as held

    return held(module)


def attention_layers(module) -> list:
    """Every attention layer of the module's networks."""
    return [block.attention for network in networks(module) for block in network.blocks]


def edited_attention(q, k, v, blocked=None, *, scale: float, dropout=None, need_weights: bool = False,
                     softmax_dim: int = -1, noise: float = 0.0, mask_after_softmax: bool = False):
    """model.attention.attention() with the edits a bug makes: softmax along another axis, noise on the scores,
    the mask applied to the weights after softmax instead of to the scores. Same arguments and outputs."""
    scores = (q @ k.transpose(-2, -1)) * scale  # (…, L, K)
    if noise:
        scores = scores + noise * torch.randn_like(scores)
    if blocked is not None and not mask_after_softmax:
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min / 2)
    weights = scores.softmax(dim=softmax_dim)
    if blocked is not None and mask_after_softmax:
        weights = weights.masked_fill(blocked, 0.0)
    out = (weights if dropout is None else dropout(weights)) @ v  # (…, L, d)
    if blocked is not None:
        empty = blocked.all(dim=-1, keepdim=True)
        out, weights = out.masked_fill(empty, 0.0), weights.masked_fill(empty, 0.0)
    return out, AttentionWeights(weights, scores, blocked) if need_weights else None


def replace_attention(plant: Plant, make: Callable) -> None:
    """attention() replaced by make(the attention() in place now), for every kind (they all call it)."""
    original = core.attention
    plant.replace(original, make(original))


def replace_mask(plant: Plant, padding: Callable) -> None:
    """Each layer builds its mask from padding(key_padding_mask) (None: no padding) instead of the batch's padding
    mask: every kind's `mask` hook, so full attention's mask and the long kinds' own layouts follow."""

    def edit(layer):
        original = layer.mask
        layer.mask = lambda key_padding_mask, L, device=None: original(
            None if key_padding_mask is None else padding(key_padding_mask.bool()), L, device)

    plant.layers(edit)


# ---- the catalogue ---------------------------------------------------------------------------------------------


@bug("saturated")
def no_scaling(plant):
    """No 1/√d_k: scores are q·k with heads of 256, so softmax is one-hot and passes no gradient."""
    plant.network(d_head=256)
    replace_attention(plant, lambda attend: lambda q, k, v, blocked=None, *, scale, **options: attend(
        q, k, v, blocked, scale=1.0, **options))


@bug("scale-too-small")
def tiny_scale(plant):
    """Scores multiplied by 0.001 inside attention(): every row is uniform, tokens cannot be told apart."""
    replace_attention(plant, lambda attend: lambda q, k, v, blocked=None, *, scale, **options: attend(
        q, k, v, blocked, scale=scale * 0.001, **options))


@bug("padding-leak", kinds=masked_kinds)
def padding_ignored(plant):
    """The padding mask ignored: real tokens attend to padded keys."""
    replace_mask(plant, lambda padding: None)


@bug("mask-inverted", kinds=masked_kinds)
def mask_inverted(plant):
    """The mask inverted: real keys blocked, padding allowed."""
    replace_mask(plant, lambda padding: ~padding)


@bug("rows-not-normalized")
def softmax_over_queries(plant):
    """Softmax taken over the query axis instead of the key axis: a row's weights no longer sum to 1."""
    replace_attention(plant, lambda attend: lambda *args, **options: edited_attention(*args, softmax_dim=-2,
                                                                                      **options))


@bug("unasked-look-ahead", kinds=masked_kinds)
def look_ahead(plant):
    """A look-ahead mask nobody asked for: every token blind to the tokens after it (the config says causal: false)."""
    plant.layers(_block_future)


def _block_future(layer):
    # Each kind blocks later keys its own way, in the key layout it was built with (model/kinds.py).
    layer.look_ahead = True


@bug("unstable-training")
def learning_rate_30x(plant):
    """The learning rate 30 times the config's."""
    plant.module(lambda module: setattr(module.hparams, "lr", 30 * module.hparams.lr))


@bug("identical-heads")
def identical_heads(plant):
    """Every head of a layer a copy of head 0 (W_Q, W_K, W_V and W_O slices) at initialisation: the heads get the
    same gradients and stay copies, as with one head module repeated in a list."""
    plant.layers(_copy_head_zero)


@torch.no_grad()
def _copy_head_zero(layer):
    H, d = layer.n_heads, layer.d_head
    for projection in (layer.w_q, layer.w_k, layer.w_v):
        rows = projection.weight.view(H, d, -1)  # (H, d, D)
        rows.copy_(rows[:1].expand_as(rows))
        if projection.bias is not None:
            projection.bias.view(H, d).copy_(projection.bias.view(H, d)[:1].expand(H, d))
    columns = layer.w_o.weight.view(-1, H, d)  # (D, H, d)
    columns.copy_(columns[:, :1].expand_as(columns))


@bug("positions-unused")
def positions_dropped(plant):
    """Positions dropped: the position vectors are zeros (and stay so) while the config says learned or sinusoidal."""

    @torch.no_grad()
    def drop(module):
        for network in networks(module):
            network.position_embedding.weight.zero_()
            network.position_embedding.weight.requires_grad_(False)

    plant.module(drop)


# ---- field bugs: how padding masks break in public code -----------------------------------------------------------


@bug("padding-leak", group="field", kinds=("full",))
def mask_on_query_axis(plant):
    """The pad mask broadcast along the query axis, (B, 1, L, 1) not (B, 1, 1, L) (hyunwoongko/transformer PR #40):
    padded queries are blocked, real queries see padded keys."""

    def edit(layer):
        def mask(key_padding_mask, L, device=None):
            blocked = key_padding_mask.bool()[:, None, :, None]  # (B, 1, L, 1); right is (B, 1, 1, L)
            future = core.attention_mask(None, layer.causal, L, device)
            return blocked if future is None else blocked | future

        layer.mask = mask

    plant.layers(edit)


@bug("padding-leak", group="field", kinds=masked_kinds)
def mask_all_attend(plant):
    """A mask of all ones in the "1 = attend" convention (yg211/bert_nli PR #3): no key is padding."""
    replace_mask(plant, torch.zeros_like)


@bug(("rows-not-normalized", "something-wrong"), group="field")
def mask_all_blocked(plant):
    """A mask that blocks every key (coreweave/kubernetes-cloud PR #146): no row has a key to look at."""
    replace_mask(plant, torch.ones_like)


@bug("padding-leak", group="field", kinds=masked_kinds)
def no_padding_mask(plant):
    """No padding mask at all in the classifier (EdwardRaff/Inside-Deep-Learning #13): padding tokens are embedded,
    attended to and pooled like words."""

    def without_mask(forward):
        return lambda ids, key_padding_mask=None, need_weights=False: forward(ids, None, need_weights)

    def edit(module):
        for network in networks(module):
            network.forward = without_mask(network.forward)

    plant.module(edit)


# ---- the contract: bugs that attention's own figures cannot show --------------------------------------------------


@bug("weight-not-learning", group="contract")
def values_detached(plant):
    """A stray .detach() on V in every layer: W_V gets no gradient and keeps its random start."""

    def edit(layer):
        attend = layer.attend
        layer.attend = lambda q, k, v, *args, **options: attend(q, k, v.detach(), *args, **options)

    plant.layers(edit)


@bug("formula-setting", group="contract")
def scale_setting(plant):
    """--model.network.scale 0.001: the scores 0.001 / (1/√d_k) of the formula's, a setting the weights can grow to
    hide."""
    plant.network(scale=0.001)


@bug("invariance-broken", group="contract")
def pooling_over_padding(plant):
    """Mean pooling over every place of the batch, padding included: a text's prediction depends on how far its
    batch is padded."""

    def edit(module):
        for network in networks(module):
            pool = network.pool
            network.pool = lambda x, key_padding_mask, pool=pool: pool(x, torch.zeros_like(key_padding_mask))

    plant.module(edit)


@bug("block-broken", group="contract")
def norm_before_attention(plant):
    """The block's LayerNorm moved before attention (a pre-norm block written into the post-norm network):
    x + attention(LayerNorm(x)) instead of LayerNorm(x + attention(x))."""

    def edit(module):
        for network in networks(module):
            for block in network.blocks:
                def forward(x, key_padding_mask, need_weights=False, block=block):
                    attended, weights = block.attention.forward_packed(block.norm1(x), key_padding_mask, need_weights)
                    x = x + block.dropout(attended)
                    if block.ffn is not None:
                        x = block.norm2(x + block.dropout(block.ffn(x)))
                    return x, weights

                block.forward = forward

    plant.module(edit)


@bug("shared-weight", group="contract")
def values_projection_reused(plant):
    """W_V assigned the layer's W_K module (self.w_v = self.w_k): one weight makes both the keys and the values."""
    plant.layers(lambda layer: setattr(layer, "w_v", layer.w_k))


@bug("optimizer-setting", group="contract")
def head_learning_rate(plant):
    """The classifier head's parameters put in a group of their own at 10× the configured learning rate, by a
    configure_optimizers edited by hand, while the config gives one rate to all."""

    plant.module(partial(scale_head_and_rest, head=10.0, rest=1.0))


def scale_head_and_rest(module, head: float, rest: float) -> None:
    """Edits module.configure_optimizers by hand, as a user would: each optimizer group split in two, the
    classifier head's parameters at lr · head, the rest at lr · rest, under the same schedule."""
    configure = module.configure_optimizers

    def configure_optimizers():
        from training.schedule import WarmupThenCosine  # here: the catalogue loads no Lightning

        result = configure()
        scheduler = result["lr_scheduler"]["scheduler"]
        in_head = {id(p) for p in module.online_model.head.parameters()}
        groups = []
        for group in scheduler.optimizer.param_groups:
            settings = {key: value for key, value in group.items() if key not in ("params", "lr", "initial_lr")}
            for scale, inside in ((head, True), (rest, False)):
                params = [p for p in group["params"] if (id(p) in in_head) == inside]
                if params:
                    groups.append({**settings, "params": params, "lr": group["initial_lr"] * scale})
        optimizer = type(scheduler.optimizer)(groups)
        result["optimizer"] = optimizer
        result["lr_scheduler"]["scheduler"] = WarmupThenCosine(  # the same schedule over the new groups
            optimizer, module.trainer.estimated_stepping_batches, module.hparams.warmup_fraction)
        return result

    module.configure_optimizers = configure_optimizers


# ---- outside the catalogue: no check was designed for these -----------------------------------------------------


@bug(group="outside")
def half_weights(plant):
    """Weights multiplied by 0.5 after softmax."""

    def make(attend):
        def halved(*args, **options):
            out, weights = attend(*args, **options)
            return out * 0.5, None if weights is None else weights._replace(weights=weights.weights * 0.5)

        return halved

    replace_attention(plant, make)


@bug(group="outside")
def noisy_scores(plant):
    """Gaussian noise of standard deviation 2 added to every score, in training and in evaluation."""
    replace_attention(plant, lambda attend: lambda *args, **options: edited_attention(*args, noise=2.0, **options))


@bug(group="outside")
def values_are_keys(plant):
    """V replaced by K: the layer mixes the keys instead of the values."""
    replace_attention(plant, lambda attend: lambda q, k, v, *args, **options: attend(q, k, k, *args, **options))


@bug(group="outside", kinds=masked_kinds)
def mask_after_softmax(plant):
    """The mask applied to the weights after softmax: padded keys get 0, but rows of padded texts sum below 1."""
    replace_attention(plant, lambda attend: lambda *args, **options: edited_attention(
        *args, mask_after_softmax=True, **options))


# Modules that register more bugs on import (the held-out group): loaded by every_bug().
BUG_MODULES = ("bench.catalogue.bugs_heldout",)


def every_bug() -> dict[str, Bug]:
    """BUGS with the bugs of BUG_MODULES registered too."""
    for name in BUG_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    return BUGS


def select_bugs(names: list[str], failed: list | None = None) -> list[Bug]:
    """--bugs: names, module:function, groups, 'all' or 'none' → the bugs, in catalogue order, each once. A user's
    module:function that does not load is an entry of `failed` (or, without it, one logged line); the bench goes on."""
    chosen, known = {}, every_bug()  # the held-out group too
    for name in names:
        if name == "none":
            continue
        matched = list(known.values()) if name == "all" else [b for b in known.values() if b.group == name]
        try:
            matched = matched or [load_bug(name)]
        except ValueError as e:
            if ":" not in name:  # a misspelt name of the catalogue stops the bench before it starts
                raise
            if failed is None:
                log.error("%s; the bench goes on without it", e)  # a user's module that fails: one line for it
            else:  # the caller says it
                failed.append({"bug": name, "dataset": None, "error": str(e)})
        for entry in matched:
            chosen[entry.name] = entry
    return list(chosen.values())


def bug_table_markdown() -> str:
    lines = ["| bug | group | expected verdict | kinds | what it does |", "|---|---|---|---|---|"]
    lines += [f"| {entry.name} | {entry.group} | {' or '.join(entry.expects) or 'any warning'} | "
              f"{', '.join(entry.kinds)} | {entry.summary} |" for entry in every_bug().values()]
    return "\n".join(lines)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(bug_table_markdown())


if __name__ == "__main__":
    # Through the importable module: BUG_MODULES register into bench.catalogue.bugs.BUGS, not __main__'s.
    from bench.catalogue.bugs import main as registered_main

    registered_main()
