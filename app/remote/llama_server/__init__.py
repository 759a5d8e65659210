"""llama.cpp's llama-server as a Backend: its slot, wire format, images, thinking and tools."""
