"""Study: does a small KDA language model train the same with our backward as with FLA's?

:mod:`.model` (the model and its synthetic task) and :mod:`.compare` (the three
runs, the table and the picture); the question, the method and the measured
answer are in README.md beside this file.
"""
