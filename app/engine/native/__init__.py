"""llama.cpp's native side: its libraries, private handles, log and hardware.

The guards here try a risky native path (repacked weights, a projector) in a child first.
"""
