"""Adapters: the only modules that talk to AWS (boto3) or to remote services over HTTP."""
