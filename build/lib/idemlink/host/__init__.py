"""idemlink's host side: the driver over pyserial, outcomes, the receipt journal and the CLI."""
