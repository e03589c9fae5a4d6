"""The proposers' room: each family's proposer and the model-free ones (prompt lookup, suffix
decoding, the hybrid). They build on the shared runtime one level up (rounds, acceptance,
sampling, caches, forwards); the shared runtime reaches in only where tests/test_layering.py
lists it, and finds a family's proposer through the registry's strings."""
