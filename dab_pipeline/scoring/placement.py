"""A model kept in eval mode on a device between calls, its weights' identity tracked (``Scorer``'s engines hold
merged copies of them: equal keys, unchanged weights)."""

from __future__ import annotations

from itertools import chain
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

__all__ = ["ModelPlacement"]


class ModelPlacement:
    """:meth:`place` puts ``model`` in eval mode on ``device`` for a call and says what its weights are (``key``).

    Only what is not so already is changed: ``eval()`` and ``to()`` walk every module and weight (~0.6 ms together
    at D = 512, a twentieth of a 100-video re-rank), and a server's model is there from its first call. The modules
    and weights of the last walk are kept and walked again only where a module now holds another child, parameter or
    buffer object than then (an identity check of their dicts, ~50 us a call; ``modules()`` and ``parameters()``
    cost ~100 us).
    """

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.key: Optional[object] = None  # the weights as place() last found them on the device
        self._walked: Optional[tuple] = None  # (modules, their dicts' ids, the weights), as last walked

    def place(self) -> bool:
        """The model in eval mode on the device -> its training flag before (:meth:`restore`); ``key`` updated."""
        was_training = self.model.training
        modules, tensors = self._walk()
        if was_training or any(m.training for m in modules):
            self.model.eval()
        key = weights_key(tensors)
        if key != self.key:  # weights moved or written since they were last placed: where are they?
            dev = self.device
            for t in tensors:
                if t.device.type != dev.type or (dev.index is not None and t.device.index != dev.index):
                    self.model.to(dev)
                    key = weights_key(self._walk(again=True)[1])
                    break
            self.key = key  # the weights as they are on this device now
        return was_training

    def restore(self, was_training: bool) -> None:
        if was_training:
            self.model.train(True)

    def _walk(self, again: bool = False) -> tuple[tuple, tuple]:
        """The model's modules and its weights (parameters, then buffers), walked again only where a module now
        holds another child, parameter or buffer object than at the last walk (an assignment, a ``del``, a write
        into ``_modules``/``_parameters``/``_buffers``, ``to()`` / ``double()`` replacing a buffer)."""
        walked = self._walked
        if again or walked is None or _held(walked[0]) != walked[1]:
            m = self.model
            modules = tuple(m.modules())
            # the walk keeps every object it saw (modules, weights), so no id it took can be reused by another
            walked = self._walked = (modules, _held(modules), (*m.parameters(), *m.buffers()))
        return walked[0], walked[2]


def _held(modules: tuple) -> tuple:
    """The ids of the modules' ``_modules`` / ``_parameters`` / ``_buffers`` dicts and of what they hold, in order
    (a dict's own id first: a value moved from one dict to the next is a change too)."""
    dicts = (d for mod in modules for d in (mod._modules, mod._parameters, mod._buffers))
    return tuple(chain.from_iterable((id(d), *map(id, d.values())) for d in dicts))


def weights_key(tensors: Sequence[Tensor]) -> object:
    """Where each weight lives and how often it was written in place: equal keys, unchanged weights.

    Writes through a parameter (an optimiser step, ``load_state_dict``) count; writes through ``.data`` do not
    (it has its own version counter): a caller who edits weights that way calls :meth:`Scorer.close`.
    """
    try:
        return tuple((t.data_ptr(), t._version) for t in tensors)
    except RuntimeError:  # inference tensors keep no version counter: never trust a kept engine
        return object()
