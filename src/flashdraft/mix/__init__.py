"""`flashdraft mix`: measure a drafter data set's domain mix, plan new prompt sources, rebalance.

- :mod:`flashdraft.mix.classify` classifies samples (coding, math, general, tool_calling, agent,
  translation, other) with transparent signals;
- :mod:`flashdraft.mix.report`, :mod:`flashdraft.mix.plan`, :mod:`flashdraft.mix.rebalance` are
  the three commands of :mod:`flashdraft.mix.cli`.
"""
