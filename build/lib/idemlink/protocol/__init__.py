"""idemlink's sans-I/O protocol core.

Everything in this package is plain computation: bytes in, events out, time passed in as numbers.
Nothing here imports serial, socket, threading, asyncio, select, time or subprocess (a test enforces
it), so the same state machines run byte by byte in a test, through an emulated lossy link, or
behind a real serial port.
"""
