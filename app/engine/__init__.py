"""Running a model: the Backend protocol, llama.cpp in-process, templates."""
