"""The loss families (CTC, ASG, graph losses, transducers) and their aligners: each
module holds its kernels, its `LossKernel` and its validation."""
