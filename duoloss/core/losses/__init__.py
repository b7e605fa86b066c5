"""The loss families (CTC, ASG, graph losses, transducers) and their aligners: each
module holds its kernels, its :class:`~duoloss.core.LossKernel` and its validation."""
