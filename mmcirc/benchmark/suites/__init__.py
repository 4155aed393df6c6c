"""The benchmark suites, one module each (how a suite declares itself:
:mod:`mmcirc.benchmark.command`; adding a suite is adding a module here):

=================  ==========================================
suite              what
=================  ==========================================
``layer``          one attention layer vs N (+ CPU targets)
``model``          whole models vs their peers, eager / compile
``compile_train``  toy training, eager vs compiled backbone
``sharded``        sharded whole-image inference vs P = 1
``launches``       ops per eager forward, host time vs peers
=================  ==========================================
"""
