"""From a model's summary and simulations to the table x-estimate prints, as text or JSON.

``table`` builds the rows (one per dtype) and renders them; ``training_text`` writes the lines
under the table that explain the Training column.
"""
