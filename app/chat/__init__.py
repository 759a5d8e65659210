"""Conversations: the session that owns one, transcripts, KV snapshots."""
