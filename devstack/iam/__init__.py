"""Every AWS call a function makes, checked against that function's role as template.yaml deploys it.

- `devstack.iam.roles`: each function's identity policies, from the SAM-translated template, resolved for a stack;
- `devstack.iam.requests`: what IAM authorizes for each API call (action, resource ARN, condition keys);
- `devstack.iam.policy`: IAM's evaluation of identity policies (explicit deny, allow, implicit deny);
- `devstack.iam.guard`: the botocore hook that refuses a call as AWS would and records the refusal.

What is checked and what is not: docs/security.md, "Checked against its own roles". moto's own IAM enforcement is
not used: it checks DynamoDB against resource ``*``, batch actions by their API names and no condition keys.
"""
