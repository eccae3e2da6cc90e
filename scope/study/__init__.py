"""The human study: a chat app that puts trained checkpoints in front of real people (``scope study
serve``) and the analysis of what they said (``scope study analyze``)."""
