"""``make bench``: what one workflow step costs in AWS requests and dollars, side by side with Step Functions."""
