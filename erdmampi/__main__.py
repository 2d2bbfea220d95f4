"""``python -m erdmampi script.py``: run a script, aborting the job on an uncaught exception."""

if __name__ == "__main__":
    from .run import main

    main()
