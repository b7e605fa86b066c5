"""The CTC gather plan and the gathered lattice, written once for every framework.

With a large vocabulary, the CTC recursion reads only the blank and each
sequence's own labels; the frontends gather those columns of ``log_probs`` on
the input's device and hand the kernel a ``(T, N, S+1)`` array instead of
``(T, N, C)`` (see `duoloss.core.losses.ctc`, "the gathered crossing").
The core's host version (numpy), the torch frontend's traced version
(``torch.compile``, ``torch.func``) and the JAX frontend all call
`gather_plan`; ``xp`` is the namespace of `duoloss._xp._backend`.
"""
from __future__ import annotations

__all__ = ["gather_plan", "gathered"]


def gather_plan(xp, targets, target_lengths, n_cls: int, blank: int):
    """``(columns (N, S+1), column_targets (N, S))`` of padded integer ``targets``.

    ``columns[b]`` lists the classes to gather (blank first, then the target's
    labels in order; padding reads the blank); ``column_targets[b, i]`` is the
    gathered column of label ``i`` (its first occurrence, ``>= 1``), or -1 for
    a label that is out of range or the blank (the kernel then returns NaN for
    that sequence, as it would on the full tensor).  ``column_targets`` has the
    dtype of ``targets``, ``columns`` too.
    """
    n, s = targets.shape
    valid = xp.arange(s, targets)[None, :] < target_lengths[:, None]
    labels = xp.where(valid, targets, blank)
    bad = valid & ((labels < 0) | (labels >= n_cls) | (labels == blank))
    same = (labels[:, :, None] == labels[:, None, :]) & valid[:, None, :]
    first = xp.argmax(same, 2) if s else xp.zeros_like(labels)
    column_targets = xp.astype(xp.where(bad, -1, first + 1), targets)
    columns = xp.concat([xp.full((n, 1), blank, labels), xp.clip(labels, 0, n_cls - 1)], 1)
    return columns, column_targets


def gathered(xp, log_probs, columns):
    """``log_probs[t, b, columns[b, k]]``: the ``(T, N, S+1)`` lattice the kernel reads."""
    t_max, n, _ = log_probs.shape
    index = xp.broadcast_to(columns[None], (t_max, n, columns.shape[1]))
    return xp.take_along_axis(log_probs, index, 2)
