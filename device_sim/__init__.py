"""idemlink's simulated device and link emulator (thin I/O shells around ``protocol``)."""
