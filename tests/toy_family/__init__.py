"""A sixth drafter family built from its own files and one registry entry, nothing else.

The bigram drafter predicts the next token from the last one alone (an embedding and a
projection, no target states). Its files are the four a family needs: `architecture.py`
(config, module, spec), `training.py` (recipe and loop on the shared blocks, with its loss),
`runtime.py` (proposer and loader) and `export.py` (one engine-free layout). Registering
`architecture.TOY_SPEC` is the family's one registry entry; tests/test_family_registry.py
trains, loads, evaluates, exports and publishes it through the house's shared code.
"""
