"""Tool-calling envs: the model acts through OpenAI-style tools declared in info["tools"]."""
