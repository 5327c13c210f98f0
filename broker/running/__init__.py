"""An attempt's life on its pods: environment and topology bound late, code delivered, launched through the pod
agent, logs kept, result committed and the pods reset (executing drives it; agent_http speaks to the agent).
"""
