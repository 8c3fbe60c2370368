"""speedlimit: how fast will this LLM run on this hardware, and how fast is it really running?"""

__version__ = "0.1.0"
