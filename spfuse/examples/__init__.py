"""End-to-end training examples: spfuse programs as layers of torch models.

Each module trains one model three ways with the same seeds -- through
``spfuse.torch`` (one spfuse program per layer, gradients by its adjoint
program), with ``torch.sparse`` and with dense torch -- and compares the loss
curves.  Run one with ``python -m spfuse.examples.gcn`` (``autoencoder``,
``attention``); ``spfuse bench --suite training`` times them.  They need
torch (``pip install torch==2.13.0``, CPU build).
"""
