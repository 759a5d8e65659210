"""Documents the user chats with: parsing, chunking, the index and retrieval (Qt-free)."""
