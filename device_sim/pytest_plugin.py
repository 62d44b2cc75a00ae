"""pytest plugin (entry point ``pytest11``): ready simulated idemlink devices for any test suite.

Fixtures are added here as the simulator grows; see the README section "The simulator in your tests".
"""
