"""The lab: simulated users and stored traffic, the loop they drive, the benchmarks, and
the ``demo``, ``loop`` and ``simulate`` commands. It drives the product through its
flows, command line and APIs; nothing in the product imports it."""
